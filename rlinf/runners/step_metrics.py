"""Per-step rollout metrics and validation scores (pure functions of a RolloutBatch)."""

from __future__ import annotations

import torch

from rlinf.data.batch import RolloutBatch
from rlinf.data.routing import has_routing, routing_bytes


def rollout_metrics(batch: RolloutBatch) -> dict[str, float]:
    assert batch.rewards is not None and batch.correct is not None
    lengths = batch.response_mask.sum(1).float()
    truncated = sum(reason == "length" for reason in batch.finish_reasons)
    routing = {"routing/bytes": float(routing_bytes(batch))} if has_routing(batch) else {}
    return {
        **routing,
        **_shaping_metrics(batch),
        "rollout/reward_mean": float(batch.rewards.mean()),
        "rollout/accuracy": float(batch.correct.float().mean()),
        "rollout/response_length_mean": float(lengths.mean()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/truncated_fraction": truncated / len(batch),
        "rollout/num_responses": float(len(batch)),
        "rollout/num_response_tokens": float(lengths.sum()),
        **batch.extras,
    }


def _shaping_metrics(batch: RolloutBatch) -> dict[str, float]:
    """With reward.overlong_buffer: the grader's reward before the length penalty, and the penalty."""
    if batch.raw_rewards is None:
        return {}
    assert batch.rewards is not None
    penalties = batch.rewards - batch.raw_rewards
    return {
        "rollout/raw_reward_mean": float(batch.raw_rewards.mean()),
        "rollout/overlong_penalty_mean": float(penalties.mean()),
        "rollout/overlong_fraction": float((penalties < 0).float().mean()),
    }


def pass_at_k(correct: torch.Tensor, group_index: torch.Tensor) -> tuple[float, float]:
    """(mean@k, pass@k) over the groups of `group_index`: mean accuracy, and any-correct rate."""
    groups = torch.unique(group_index)
    any_correct = torch.stack([correct[group_index == g].any() for g in groups]).float()
    return float(correct.float().mean()), float(any_correct.mean())


def merged_scores(batches: list[RolloutBatch]) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, group_index) of scored batches from separate generate calls; each call numbers its
    groups from 0, so later batches' group ids are shifted past the earlier ones."""
    correct, groups, offset = [], [], 0
    for batch in batches:
        assert batch.correct is not None
        correct.append(batch.correct)
        groups.append(batch.group_index + offset)
        offset += int(batch.group_index.max()) + 1
    return torch.cat(correct), torch.cat(groups)
