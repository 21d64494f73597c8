"""fp16: the loss scaler moves once per optimizer step: the actor prepares the grads (which updates
the scaler) once, for the grad norm (clip_grad_norm), and steps with them (optimizer_step)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh megatron-cpu)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import VOCAB, build_actor, tokens  # noqa: E402

from rlinf.models.megatron.adam_state import optimizer_parts  # noqa: E402


def test_one_step_moves_the_fp16_loss_scaler_once(on_cpu, tiny_megatron_checkpoint):
    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp16")
    scalers = {id(o.grad_scaler): o.grad_scaler for o in optimizer_parts(actor.optimizer)}
    assert scalers, "fp16 built no loss scaler"
    model = actor.model[0]
    for step in (1, 2):
        model.zero_grad_buffer()
        actor.optimizer.zero_grad()
        batch = tokens(step)
        positions = torch.arange(batch.shape[1]).expand_as(batch)
        logits = model(input_ids=batch[:, :-1], position_ids=positions[:, :-1], attention_mask=None)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        actor.optimizer.scale_loss(loss).backward()
        model.finish_grad_sync()
        assert torch.isfinite(torch.tensor(actor.clip_grad_norm(1e9)))
        actor.optimizer_step()
        for scaler in scalers.values():
            assert scaler._growth_tracker == step, "the loss scaler counted a step twice"
    assert all("update" not in vars(s) for s in scalers.values()), "the scaler's update stayed replaced"
