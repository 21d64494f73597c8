"""The reward role: grades responses in a process pool and fills rewards / correctness."""

from __future__ import annotations

from dataclasses import replace

import torch

from rlinf.config.schema import Config
from rlinf.data.batch import RolloutBatch
from rlinf.rewards.registry import build_reward


class RewardWorker:
    def __init__(self, cfg: Config, *, rank: int = 0, world_size: int = 1) -> None:
        r = cfg.reward
        self.reward = build_reward(
            r.reward_type, reward_scale=r.reward_scale, timeout_s=r.timeout_s, num_workers=r.num_workers
        )

    def score(self, batch: RolloutBatch) -> RolloutBatch:
        result = self.reward.score(batch.response_text, batch.solutions)
        extras = {**batch.extras, "reward/timeouts": float(result.timeouts)}
        return replace(
            batch,
            rewards=torch.tensor(result.rewards, dtype=torch.float32),
            correct=torch.tensor(result.correct, dtype=torch.bool),
            extras=extras,
        )

    def close(self) -> None:
        self.reward.close()
