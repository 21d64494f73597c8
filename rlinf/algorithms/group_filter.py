"""Which GRPO groups carry a learning signal (`algorithm.dynamic_sampling.metric`).

A group whose metric is equal for every response gets all-zero advantages (advantages.py), so it
adds nothing to the policy gradient; dynamic sampling drops it and generates on more prompts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlinf.algorithms.advantages import GroupStats
from rlinf.algorithms.registry import Registry

# A scored batch's per-row values, [B] float, whose spread within a group is the signal.
GroupMetric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
GROUP_METRICS: Registry[GroupMetric] = Registry("dynamic sampling metric (algorithm.dynamic_sampling.metric)")


@GROUP_METRICS.register("reward")
def reward_metric(rewards: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """The reward the advantages are computed from (after any overlong shaping)."""
    return rewards


@GROUP_METRICS.register("accuracy")
def accuracy_metric(rewards: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """The grader's verdict: a group that is all right or all wrong is dropped even when the
    overlong penalty spreads its rewards (DAPO's choice)."""
    return correct.float()


def rows_with_signal(
    metric: str, rewards: torch.Tensor, correct: torch.Tensor, group_index: torch.Tensor
) -> torch.Tensor:
    """[B] bool: True on the rows of groups whose `metric` values are not all equal."""
    values = GROUP_METRICS.get(metric)(rewards, correct)
    groups = GroupStats.of(values, group_index)
    return ~groups.is_constant[groups.row_group]
