"""The reward role: grades response texts against reference answers in a process pool."""

from __future__ import annotations

from collections.abc import Sequence

from rlinf.config.schema import Config
from rlinf.rewards.grader_pool import RewardResult
from rlinf.rewards.registry import build_reward


class RewardWorker:
    def __init__(self, cfg: Config, *, rank: int = 0, world_size: int = 1) -> None:
        r = cfg.reward
        self.reward = build_reward(
            r.reward_type, reward_scale=r.reward_scale, timeout_s=r.timeout_s, num_workers=r.num_workers
        )

    def score(self, responses: Sequence[str], solutions: Sequence[Sequence[str]]) -> RewardResult:
        """Reward and verdict per response (same order), and how many gradings timed out."""
        return self.reward.score(responses, solutions)

    def close(self) -> None:
        self.reward.close()
