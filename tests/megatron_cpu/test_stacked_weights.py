"""rlinf's grouped-GEMM experts under megatron-core's real DDP and distributed optimizer (one gloo rank
on the CPU): their weights sit back to back in DDP's buffer in expert order, so the grouped GEMM reads
them in place and adds their gradient into `main_grad` at once (rlinf.models.megatron.stacked_weights);
training that way lands on exactly the weights of the copying path (torch.stack, a gradient per
expert added by DDP's hook)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import build_actor, tokens, train_step  # noqa: E402

from rlinf.models.megatron.grouped_experts import ExpertLinears  # noqa: E402
from rlinf.models.megatron.stacked_weights import back_to_back  # noqa: E402


def expert_linears(actor) -> list[ExpertLinears]:
    return [m for m in actor.model[0].modules() if isinstance(m, ExpertLinears)]


def test_ddp_lays_the_expert_weights_and_main_grads_out_back_to_back(on_cpu, tiny_megatron_checkpoint):
    actor = build_actor(tiny_megatron_checkpoint, "fp32", grouped_experts=True)
    linears = expert_linears(actor)
    assert linears and all(linear.in_place and linear.in_place.main_grad is not None for linear in linears)
    for linear in linears:
        weights = linear.weights()
        assert back_to_back([w.detach() for w in weights]) is not None
        assert back_to_back([w.main_grad for w in weights]) is not None
        assert linear.stacked().data_ptr() == weights[0].data_ptr()  # read in place, not copied


def test_two_steps_land_on_the_weights_of_the_copying_path(on_cpu, tiny_megatron_checkpoint):
    trained = []
    for in_place in (True, False):
        actor = build_actor(tiny_megatron_checkpoint, "fp32", grouped_experts=True)
        built = [p.detach().clone() for p in actor.model[0].parameters()]
        if not in_place:
            for linear in expert_linears(actor):
                linear.in_place = None  # torch.stack, a gradient per expert added by DDP's hook
        losses = [train_step(actor, tokens(step), counted=True) for step in range(2)]
        trained.append((losses, [p.detach().clone() for p in actor.model[0].parameters()]))
    (losses, weights), (copied_losses, copied_weights) = trained
    assert losses == copied_losses
    assert all(torch.equal(a, b) for a, b in zip(weights, copied_weights, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(weights, built, strict=True))
