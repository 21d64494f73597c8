"""algorithm.recompute_logprobs: with it off, the runner trains on the rollout's own logprobs as
pi_old, never asks the actor for a recompute, and reports no rollout/actor mismatch it did not
measure; with it on (the default) the actor's recompute is pi_old and the mismatch is reported."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rlinf.config import load_config
from rlinf.data.batch import RolloutBatch
from rlinf.runners import grpo_runner
from rlinf.scheduler.roles import Roles
from rlinf.utils.metrics import MetricLogger

ROWS, WIDTH = 8, 5


def _batch() -> RolloutBatch:
    torch.manual_seed(0)
    lengths = torch.randint(1, WIDTH + 1, (ROWS,))
    response_mask = torch.arange(WIDTH)[None] < lengths[:, None]
    return RolloutBatch(
        prompt_ids=torch.ones(ROWS, 3, dtype=torch.long),
        prompt_mask=torch.ones(ROWS, 3, dtype=torch.bool),
        response_ids=torch.full((ROWS, WIDTH), 2),
        response_mask=response_mask,
        group_index=torch.arange(ROWS) // 4,
        rollout_logprobs=-torch.rand(ROWS, WIDTH) * response_mask,
        finish_reasons=["stop"] * ROWS,
        response_text=["1"] * ROWS,
        solutions=[("1",)] * ROWS,
    )


class _Rollout:
    def __init__(self) -> None:
        self.batch = _batch()

    def generate(self, prompts, group_size, sampling, seed, keep_groups=None):
        assert keep_groups is None  # data.oversample_prompts is 0: every group is kept
        return self.batch


class _Reward:
    def score(self, batch):
        return replace(
            batch, rewards=torch.arange(ROWS, dtype=torch.float32), correct=torch.arange(ROWS) % 2 == 0
        )


class _Actor:
    def __init__(self) -> None:
        self.recomputed = 0
        self.trained: list[RolloutBatch] = []

    def compute_logprobs(self, batch):
        self.recomputed += 1
        return replace(batch, old_logprobs=(batch.rollout_logprobs - 0.25) * batch.response_mask)

    def train(self, batch, step):
        self.trained.append(batch)
        return {"actor/policy_loss": 0.0}


@pytest.mark.parametrize("recompute", [True, False])
def test_pi_old_comes_from_the_recompute_or_from_the_rollout(tmp_path, monkeypatch, recompute):
    monkeypatch.setattr(grpo_runner, "sync_weights", lambda roles, bucket_mb: "test")
    cfg = load_config(
        "tiny-moe-grpo-cpu",
        [
            f"algorithm.recompute_logprobs={str(recompute).lower()}",
            "data.rollout_batch_size=2",
            "algorithm.group_size=4",
            "actor.global_batch_size=8",
            "actor.micro_batch_size=4",
            f"runner.output_dir={tmp_path / 'results'}",
        ],
    )
    rollout, actor = _Rollout(), _Actor()
    roles = Roles(actor=actor, rollout=rollout, reward=_Reward(), colocated=False)  # type: ignore[arg-type]
    runner = grpo_runner.GRPORunner(cfg, roles, list(range(8)), None, MetricLogger(tmp_path / "logs", ()))
    metrics = runner.train_step()
    (trained,) = actor.trained
    assert actor.recomputed == int(recompute)
    mask = rollout.batch.response_mask
    if recompute:
        assert torch.equal(trained.old_logprobs, (rollout.batch.rollout_logprobs - 0.25) * mask)
        assert metrics["rollout/logprob_abs_diff"] == pytest.approx(0.25)
        assert "time/logprobs" in metrics
    else:
        assert torch.equal(trained.old_logprobs, rollout.batch.rollout_logprobs)
        assert not any(k.startswith("rollout/logprob_abs_diff") for k in metrics)
        assert "time/logprobs" not in metrics
    assert trained.advantages is not None and metrics["time/step"] > 0
