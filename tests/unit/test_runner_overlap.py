"""runner.max_staleness: 1 through the real runner with fake roles: the producer generates each
step's batch with that step's seed, every trained row carries the version of the weights that
sampled it and at most one version old, and the loss gets the rollout logprobs of those weights."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from rlinf.config import load_config
from rlinf.data.batch import RolloutBatch
from rlinf.runners import grpo_runner
from rlinf.scheduler.roles import Roles
from rlinf.utils.metrics import MetricLogger

ROWS, WIDTH, STEPS = 8, 3, 5


class _Rollout:
    def __init__(self) -> None:
        self.weights = 0  # the actor version loaded
        self.seeds: list[int] = []

    def generate(self, prompts, group_size, sampling, seed, keep_groups=None):
        self.seeds.append(seed)
        return RolloutBatch(
            prompt_ids=torch.ones(ROWS, 2, dtype=torch.long),
            prompt_mask=torch.ones(ROWS, 2, dtype=torch.bool),
            response_ids=torch.full((ROWS, WIDTH), 2),
            response_mask=torch.ones(ROWS, WIDTH, dtype=torch.bool),
            group_index=torch.arange(ROWS) // group_size,
            # the behaviour logprobs say which weights sampled them
            rollout_logprobs=torch.full((ROWS, WIDTH), -1.0 - self.weights),
            finish_reasons=["stop"] * ROWS,
            response_text=["1"] * ROWS,
            solutions=[("1",)] * ROWS,
        )


class _Reward:
    def score(self, batch):
        return replace(batch, rewards=torch.arange(ROWS, dtype=torch.float32), correct=torch.ones(ROWS) > 0)


class _Actor:
    def __init__(self) -> None:
        self.version = 0
        self.trained: list[RolloutBatch] = []

    def compute_logprobs(self, batch):
        return replace(batch, old_logprobs=torch.full_like(batch.rollout_logprobs, -1.0 - self.version))

    def train(self, batch, step):
        time.sleep(0.05)  # the producer runs ahead meanwhile
        self.trained.append(batch)
        self.version += 1
        return {"actor/policy_loss": 0.0}


def test_bound_1_trains_tagged_rows_at_most_one_version_old(tmp_path, monkeypatch):
    rollout, actor = _Rollout(), _Actor()

    def staged_sync(roles, bucket_mb):
        version = actor.version  # the export is of the weights as they are now
        return (lambda: setattr(rollout, "weights", version)), True

    monkeypatch.setattr(grpo_runner, "staged_sync", staged_sync)
    monkeypatch.setattr(grpo_runner, "strategy_for", lambda roles: "test")
    cfg = load_config(
        "tiny-moe-grpo-cpu",
        [
            "runner.max_staleness=1",
            "algorithm.rollout_is.mode=token_tis",
            f"runner.max_steps={STEPS}",
            "runner.save_at_end=false",
            "runner.val_check_interval=0",
            "data.rollout_batch_size=2",
            "algorithm.group_size=4",
            "actor.global_batch_size=8",
            "actor.micro_batch_size=4",
            f"runner.output_dir={tmp_path / 'results'}",
        ],
    )
    roles = Roles(actor=actor, rollout=rollout, reward=_Reward(), colocated=False)  # type: ignore[arg-type]
    runner = grpo_runner.GRPORunner(cfg, roles, list(range(64)), None, MetricLogger(tmp_path / "logs", ()))
    runner.run()
    assert len(actor.trained) == STEPS
    assert rollout.seeds == [runner._seed("rollout", step=step) for step in range(1, STEPS + 1)]
    lags = []
    for step, batch in enumerate(actor.trained, start=1):
        version = int(batch.policy_version[0])
        assert torch.equal(batch.policy_version, torch.full((ROWS,), version))
        assert torch.equal(batch.rollout_logprobs, torch.full((ROWS, WIDTH), -1.0 - version))
        lags.append(step - 1 - version)
    assert lags[0] == 0 and max(lags) == 1 and min(lags[1:]) >= 0  # it ran ahead, within the bound
