"""benchmarks/actor_throughput.py measures several actors in one process, one after another. Each one's
peak memory must be its own: megatron-core's DDP model and optimizer outlive `del actor` (their
gradient hooks sit on autograd nodes the collector cannot see through), so `release` offloads them
before dropping the actor. Checked on the buffers themselves: after release they hold no storage,
whether or not the objects are still reachable."""

from __future__ import annotations

import importlib.util

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import build_actor, tokens, train_step  # noqa: E402

from benchmarks._common import release  # noqa: E402


def held_bytes(buffers) -> int:
    return sum(
        b.param_data.untyped_storage().nbytes() + b.grad_data.untyped_storage().nbytes() for b in buffers
    )


def test_release_frees_the_model_and_grad_buffers_an_actor_leaves_behind(
    on_cpu, tiny_megatron_checkpoint, monkeypatch
):
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)  # host memory is the memory here
    actor = build_actor(tiny_megatron_checkpoint, "fp32")
    train_step(actor, tokens(0), counted=True)
    actor.offloaded = False
    buffers = [b for chunk in actor.model for b in (*chunk.buffers, *chunk.expert_parallel_buffers)]
    assert held_bytes(buffers) > 0
    release(actor)
    assert held_bytes(buffers) == 0
