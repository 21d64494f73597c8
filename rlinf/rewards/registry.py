"""Reward functions by name, as selected by RewardConfig.reward_type."""

from __future__ import annotations

from rlinf.rewards.grader_pool import MathReward

REWARDS = {"math": MathReward}


def build_reward(reward_type: str, **kwargs):
    """Instantiate the reward registered as reward_type with kwargs (e.g. reward_scale, timeout_s)."""
    if reward_type not in REWARDS:
        raise ValueError(f"unknown reward_type {reward_type!r}; valid: {', '.join(sorted(REWARDS))}")
    return REWARDS[reward_type](**kwargs)
