"""MoE routing replay on the torch path: the embedded rollout records the experts of every token, and
the torch actor, whose own routers are pushed to disagree, computes through exactly those experts
(padded and packed micro-batches, recompute and training forward), while measuring how often its
own choice agreed."""

import json

import pytest
import torch

from rlinf.data.datasets import PromptItem
from rlinf.models.routing import moe_gates
from rlinf.workers.actor.base import with_logprobs
from rlinf.workers.actor.torch_actor import TorchActor
from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.torch_rollout import TorchRollout
from tests.integration.conftest import small_config

PROMPTS = ["1+2-3=", "9-4+7=", "5+5=", "8-1-2+6=", "3+", "7-7+7-7+7="]


def _config(checkpoint, out, mode, pack=False):
    overrides = {
        "algorithm.routing_replay.mode": mode,
        "actor.pack_sequences": str(pack).lower(),
        "data.rollout_batch_size": len(PROMPTS),
        "algorithm.group_size": 2,
        "actor.global_batch_size": 2 * len(PROMPTS),
        "actor.micro_batch_size": 4,
        "rollout.max_batch_size": 4,  # two decoding chunks of different prompt widths
    }
    return small_config(checkpoint, out, **overrides)


def _rollout_batch(cfg):
    rollout = TorchRollout(cfg)
    items = [PromptItem(tuple(rollout.tokenizer.encode(text)), text, ("0",), "test") for text in PROMPTS]
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    batch = rollout.generate(items, 2, params, seed=3)
    assert batch.prompt_experts is not None and batch.response_experts is not None
    assert batch.prompt_experts.dtype == torch.uint8
    lengths = batch.response_mask.sum(1)
    assert len(set(lengths.tolist())) > 1, "rows must end at different steps"
    return batch


def _disagreeing_actor(cfg) -> TorchActor:
    """An actor whose routers choose differently from the rollout's: its selection biases moved."""
    actor = TorchActor(cfg)
    generator = torch.Generator().manual_seed(0)
    for gate in moe_gates(actor.model):
        gate.e_score_correction_bias.copy_(
            0.3 * torch.randn(gate.e_score_correction_bias.shape, generator=generator)
        )
    return actor


def _used_experts(actor, batch):
    """The experts each MoE layer actually computed with in one forward of the actor over `batch`
    (what its expert modules receive), per row: [real tokens, layers, k], in token order."""
    seen: list[torch.Tensor] = []
    hooks = [
        gate_layer.mlp.experts.register_forward_pre_hook(
            lambda _m, args: seen.append(args[1].detach().clone())
        )
        for gate_layer in actor.model.model.layers
        if hasattr(gate_layer.mlp, "gate")
    ]
    try:
        with torch.no_grad():
            actor._logprobs(actor.model, batch)
    finally:
        for hook in hooks:
            hook.remove()
    per_token = torch.stack(seen, dim=1)  # [forward's tokens, layers, k]
    trimmed = batch.trimmed()
    mask = torch.cat([trimmed.prompt_mask, trimmed.response_mask], 1)
    if actor.cfg.actor.pack_sequences:
        real = per_token
    else:
        real = per_token.unflatten(0, mask.shape)[mask]
    counts = mask.sum(1).tolist()
    return list(real.split(counts))


def _rollout_experts(batch):
    """Per row, the experts the rollout routed each fed token to: its real prompt tokens, then its
    response tokens but the last (sampled, never fed back), read straight off the batch."""
    rows = []
    for i in range(len(batch)):
        prompt = batch.prompt_experts[i][batch.prompt_mask[i]]
        response = batch.response_experts[i][batch.response_mask[i]][:-1]
        rows.append(torch.cat([prompt, response]).long())
    return rows


def _same_sets(a, b):
    return (a.sort(-1).values == b.sort(-1).values).all(-1)


@pytest.mark.parametrize("pack", [False, True])
def test_replay_makes_the_actor_compute_through_the_rollouts_experts(random_tiny_checkpoint, tmp_path, pack):
    batch = _rollout_batch(_config(random_tiny_checkpoint, tmp_path, "replay", pack))
    expected = _rollout_experts(batch)
    replaying = _disagreeing_actor(_config(random_tiny_checkpoint, tmp_path, "replay", pack))
    measuring = _disagreeing_actor(_config(random_tiny_checkpoint, tmp_path, "measure", pack))

    own = _used_experts(measuring, batch)
    disagree = sum(int((~_same_sets(o[: len(e)], e)).sum()) for o, e in zip(own, expected, strict=True))
    assert disagree > 0, "the actor's own routing must differ, or this test could not fail without replay"

    used = _used_experts(replaying, batch)
    for row, (u, e) in enumerate(zip(used, expected, strict=True)):
        # the row's last token was never routed by the rollout: there the actor keeps its own choice
        assert bool(_same_sets(u[: len(e)], e).all()), (
            f"row {row}: the actor used other experts than the rollout"
        )


@pytest.mark.parametrize("mode", ["measure", "replay"])
def test_recompute_reports_the_routers_own_agreement(random_tiny_checkpoint, tmp_path, mode):
    batch = _rollout_batch(_config(random_tiny_checkpoint, tmp_path, mode))
    expected = _rollout_experts(batch)
    actor = _disagreeing_actor(_config(random_tiny_checkpoint, tmp_path, mode))
    rows = actor.compute_logprobs(batch)
    merged = with_logprobs(batch, [rows])
    layers = expected[0].shape[1]
    total = sum(len(e) for e in expected) * layers
    assert merged.extras["routing/num_compared"] == total
    agreement = merged.extras["routing/agreement"]
    assert 0.0 < agreement < 1.0
    if mode == "measure":  # without replay the first forward is the router's own: count it directly
        own = _used_experts(actor, batch)
        agreeing = sum(int(_same_sets(o[: len(e)], e).sum()) for o, e in zip(own, expected, strict=True))
        assert merged.extras["routing/num_agreeing"] == agreeing
    assert merged.extras["time/routing_recompute"] >= 0.0


def test_training_forward_replays_like_the_recompute(random_tiny_checkpoint, tmp_path):
    """Recompute and training forward both replay: the first (and only) minibatch's ratio is exactly 1
    although the actor's own routers disagree with the rollout's (without replay in training it is not)."""
    cfg = _config(random_tiny_checkpoint, tmp_path, "replay")
    batch = _rollout_batch(cfg)
    actor = _disagreeing_actor(cfg)
    batch = with_logprobs(batch, [actor.compute_logprobs(batch)])
    assert batch.extras["routing/agreement"] < 1.0
    batch.advantages = torch.linspace(-1, 1, len(batch))
    metrics = actor.train(batch, step=1)
    assert abs(metrics["actor/ratio_mean"] - 1.0) < 1e-6
    assert metrics["actor/ratio_max"] < 1.0 + 1e-5
    assert metrics["time/routing_train"] > 0.0


@pytest.mark.slow
def test_grpo_steps_with_replay_report_full_agreement(random_tiny_checkpoint, tmp_path, ray_session):
    """Through the runner and Ray workers: the rollout records, the batch carries the routing to the
    actor, which replays it; with the same weights on both sides (fp32 CPU) the routers agree."""
    from rlinf.runners.main import run

    overrides = {
        "algorithm.routing_replay.mode": "replay",
        "runner.max_steps": 2,
        "runner.val_check_interval": 0,
        "runner.save_at_end": "false",
    }
    assert run(small_config(random_tiny_checkpoint, tmp_path, **overrides)) == 0
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2
    for row in steps:
        assert row["routing/agreement"] == 1.0, row["routing/agreement"]
        assert row["routing/num_compared"] > 0
        assert row["routing/bytes"] > 0
        assert {"time/routing_record", "time/routing_recompute", "time/routing_train"} <= set(row)
        assert row["rollout/logprob_abs_diff"] < 1e-4
