"""`actor.logprob_micro_batch_size` on the Megatron actor (one CPU rank, fp32): the logprob pass
runs that many rows a forward, and recomputes the logprobs the training-sized micro-batches give.
The torch actor's twin: tests/integration/test_actor_micro_batches.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from actor_on_cpu import build_actor, varied_batch

pytest.importorskip("megatron.core", reason="needs megatron-core (the megatron-cpu venv)")


def logprobs_and_forwards(actor, batch, logprob_rows):
    from rlinf.workers.actor.policy_update import DPInfo, UpdateSettings

    actor.settings = replace(
        UpdateSettings.from_config(actor.cfg), micro_batch_size=2, logprob_micro_batch_size=logprob_rows
    )
    actor.dp = DPInfo()
    widths, forward = [], actor._forward

    def counted(model, inputs):
        widths.append(int(inputs.mask.shape[0]))
        return forward(model, inputs)

    actor._forward = counted
    try:
        old, _ = actor.policy_logprobs(batch)
    finally:
        del actor._forward
    return old, widths


def test_the_logprob_pass_takes_its_own_rows_per_forward(on_cpu, tiny_megatron_checkpoint):
    batch = varied_batch((9, 3, 6, 1, 8, 5, 2, 7), (11, 1, 7, 4, 2, 9, 5, 3))
    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    training_sized, rows_a = logprobs_and_forwards(actor, batch, None)
    larger, rows_b = logprobs_and_forwards(actor, batch, 8)
    assert rows_a == [2, 2, 2, 2] and rows_b == [8]
    assert bool((training_sized[batch.response_mask] != 0).all())
    torch.testing.assert_close(larger, training_sized, rtol=0, atol=1e-5)
