"""MoE routing replay in the Megatron actor (megatron-core on the CPU, fp32, one gloo rank): every
TopKRouter routes each recorded token to the recorded experts, in the right-padded and the packed
THD layouts; the recompute counts the routers' own agreement; the replayed experts' router rows,
and only theirs, get gradients."""

from __future__ import annotations

import importlib.util

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import build_actor, recorded_experts, varied_batch, with_recorded_experts  # noqa: E402

LAYERS = 2  # MoE layers of the tiny checkpoint (layer 0 is dense); top-2 routing
REPLAYED = 4  # the recorded experts are all among 0..3 of the 8


def _recorded_experts(row: int, position: int, layer: int) -> list[int]:
    return recorded_experts(row, position, layer, REPLAYED)


def routed_batch():
    """varied_batch with recorded experts (among 0..3) for every fed token."""
    return with_recorded_experts(varied_batch(), LAYERS, REPLAYED)


def _routes(actor, batch):
    """Forward `batch` once; each router's (experts chosen, token count) and the logprobs."""
    from megatron.core.transformer.moe.router import TopKRouter

    seen = []
    routers = [m for m in actor.model[0].modules() if isinstance(m, TopKRouter)]
    hooks = [
        r.register_forward_hook(lambda _m, _i, out: seen.append(out[1].detach().clone())) for r in routers
    ]
    try:
        logprobs, _ = actor._logprobs(actor.model[0], batch)
    finally:
        for hook in hooks:
            hook.remove()
    return seen, logprobs


def _expected_positions(batch, packed: bool):
    """For each token the routers see, (row, position in the row's real sequence) or None for
    padding: right-padded rows seen sequence-major, or the packed real tokens in row order."""
    lengths = [int(p + r) for p, r in zip(batch.prompt_mask.sum(1), batch.response_mask.sum(1), strict=True)]
    if packed:
        return [(i, t) for i, n in enumerate(lengths) for t in range(n)]
    width = int(batch.prompt_mask.sum(1).max()) + batch.response_ids.shape[1]
    return [(i, t) if t < lengths[i] else None for t in range(width) for i in range(len(batch))]


@pytest.mark.parametrize("packed", [False, True])
def test_every_router_takes_the_recorded_experts(on_cpu, tiny_megatron_checkpoint, packed):
    batch = routed_batch()
    lengths = (batch.prompt_mask.sum(1) + batch.response_mask.sum(1)).tolist()
    actor = build_actor(
        tiny_megatron_checkpoint, "fp32", precision="fp32", pack_sequences=packed, routing_replay="replay"
    )
    own = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32", pack_sequences=packed)
    replayed, _ = _routes(actor, batch)
    free, _ = _routes(own, batch)
    positions = _expected_positions(batch, packed)
    differs = 0
    for layer in range(LAYERS):
        assert replayed[layer].shape[0] == len(positions)
        for token, where in enumerate(positions):
            if where is None or where[1] == lengths[where[0]] - 1:
                continue  # padding and each row's last token: not recorded
            expected = sorted(_recorded_experts(*where, layer))
            assert replayed[layer][token].nonzero().flatten().tolist() == expected, (layer, where)
            differs += free[layer][token].nonzero().flatten().tolist() != expected
    assert differs > 0, "the router's own choice must differ, or this test could not fail without replay"


def test_recompute_counts_the_routers_own_agreement(on_cpu, tiny_megatron_checkpoint):
    batch = routed_batch()
    lengths = (batch.prompt_mask.sum(1) + batch.response_mask.sum(1)).tolist()
    own = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    free, _ = _routes(own, batch)
    positions = _expected_positions(batch, packed=False)
    agreeing = compared = 0
    for layer in range(LAYERS):
        for token, where in enumerate(positions):
            if where is None or where[1] == lengths[where[0]] - 1:
                continue
            compared += 1
            agreeing += free[layer][token].nonzero().flatten().tolist() == sorted(
                _recorded_experts(*where, layer)
            )
    measuring = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32", routing_replay="measure")
    measuring.settings = _settings(measuring)
    measuring.dp = _dp()
    measuring.policy_logprobs(batch)
    metrics = measuring.recompute_metrics()
    assert metrics["routing/num_compared"] == compared
    assert metrics["routing/num_agreeing"] == agreeing


def test_gradients_reach_the_replayed_experts_router_rows_only(on_cpu, tiny_megatron_checkpoint):
    from megatron.core.transformer.moe.router import TopKRouter

    batch = routed_batch()
    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32", routing_replay="replay")
    model = actor.model[0]
    model.zero_grad_buffer()
    logprobs, _ = actor._logprobs(model, batch)
    (logprobs * torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1))).sum().backward()
    model.finish_grad_sync()
    for router in (m for m in model.modules() if isinstance(m, TopKRouter)):
        rows = router.weight.main_grad.abs().sum(1)
        assert bool((rows[:REPLAYED] > 0).all()), rows
        assert bool((rows[REPLAYED:] == 0).all()), f"experts nobody was routed to got gradients: {rows}"


def _settings(actor):
    from rlinf.workers.actor.policy_update import UpdateSettings

    return UpdateSettings.from_config(actor.cfg)


def _dp():
    from rlinf.workers.actor.policy_update import DPInfo

    return DPInfo()
