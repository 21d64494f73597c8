"""The reward role: grades response texts against reference answers in a process pool, then
shapes the rewards by response length (reward.overlong_buffer)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rlinf.config.schema import Config
from rlinf.rewards.grader_pool import RewardResult
from rlinf.rewards.overlong import overlong_penalties
from rlinf.rewards.registry import build_reward


class RewardWorker:
    def __init__(self, cfg: Config, *, rank: int = 0, world_size: int = 1) -> None:
        r = cfg.reward
        self.reward = build_reward(
            r.reward_type, reward_scale=r.reward_scale, timeout_s=r.timeout_s, num_workers=r.num_workers
        )
        self.overlong = r.overlong_buffer
        self.max_length = cfg.algorithm.sampling_params.max_new_tokens

    def score(
        self, responses: Sequence[str], solutions: Sequence[Sequence[str]], lengths: Sequence[int]
    ) -> RewardResult:
        """Reward and verdict per response (same order), and how many gradings timed out.
        `lengths`: each response's tokens, for the overlong penalty."""
        if len(lengths) != len(responses):
            raise ValueError(f"{len(responses)} responses but {len(lengths)} lengths")
        result = self.reward.score(responses, solutions)
        if not self.overlong.enable:
            return result
        o = self.overlong
        penalties = overlong_penalties(lengths, self.max_length, o.len, o.penalty_factor)
        shaped = [r + p for r, p in zip(result.rewards, penalties, strict=True)]
        return replace(result, rewards=shaped, overlong_penalties=penalties)

    def close(self) -> None:
        self.reward.close()
