"""Group-relative advantage estimators (`algorithm.adv_type`): one scalar per response.

Responses to the same prompt form a group, identified by `group_index`; rows of a group may sit
anywhere in the batch. A group whose rewards are all equal (a singleton included) carries no
learning signal: its advantages are set to exactly zero and it is counted in the metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlinf.algorithms.registry import Registry


@dataclass(frozen=True)
class GroupStats:
    """Per-group reward statistics; every [G] tensor is indexed by the compact id in `row_group`."""

    row_group: torch.Tensor  # [B] long, compact group id 0..G-1 of each row
    size: torch.Tensor  # [G] members
    total: torch.Tensor  # [G] reward sum
    mean: torch.Tensor  # [G]
    std: torch.Tensor  # [G] sample std with Bessel's correction; 0 for a singleton
    is_constant: torch.Tensor  # [G] bool, all rewards of the group are equal

    @classmethod
    def of(cls, rewards: torch.Tensor, group_index: torch.Tensor) -> GroupStats:
        group_ids, row_group = torch.unique(group_index, return_inverse=True)
        num_groups = group_ids.numel()
        zeros = rewards.new_zeros(num_groups)
        size = zeros.index_add(0, row_group, torch.ones_like(rewards))
        total = zeros.index_add(0, row_group, rewards)
        mean = total / size
        squared_deviation = zeros.index_add(0, row_group, (rewards - mean[row_group]) ** 2)
        std = (squared_deviation / (size - 1).clamp(min=1)).sqrt()
        highest = zeros.scatter_reduce(0, row_group, rewards, reduce="amax", include_self=False)
        lowest = zeros.scatter_reduce(0, row_group, rewards, reduce="amin", include_self=False)
        return cls(row_group, size, total, mean, std, highest == lowest)


AdvantageFn = Callable[[torch.Tensor, GroupStats, float], torch.Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator (algorithm.adv_type)")


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: torch.Tensor, groups: GroupStats, eps: float) -> torch.Tensor:
    """(r - group mean) / (group std + eps), with the Bessel-corrected sample std (as torch.std)."""
    rows = groups.row_group
    return (rewards - groups.mean[rows]) / (groups.std[rows] + eps)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor, groups: GroupStats, eps: float) -> torch.Tensor:
    """r - group mean: no division by the std, which would up-weight near-unanimous groups."""
    return rewards - groups.mean[groups.row_group]


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: torch.Tensor, groups: GroupStats, eps: float) -> torch.Tensor:
    """r - mean of the other members of the group (leave-one-out baseline); 0 for a singleton."""
    rows = groups.row_group
    others = groups.size[rows] - 1
    baseline = (groups.total[rows] - rewards) / others.clamp(min=1)
    return torch.where(others > 0, rewards - baseline, torch.zeros_like(rewards))


@dataclass(frozen=True)
class AdvantageResult:
    advantages: torch.Tensor  # [B] float, one per response
    metrics: dict[str, float]


def compute_advantages(
    adv_type: str,
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    *,
    eps: float = 1e-6,
    normalize: bool = False,
) -> AdvantageResult:
    """Advantages of `rewards` [B] float within the groups of `group_index` [B] long.

    `normalize` whitens the result over the whole batch, (a - mean) / (std + eps) with the sample
    std. All three estimators already give every group a zero mean, so this is almost a pure
    rescaling and zero-signal groups stay (numerically) at zero.

    Metrics: `advantages/zero_std_groups` (groups with all-equal rewards, singletons included),
    `advantages/zero_std_fraction` (of all groups), `advantages/nonzero_fraction` (rows whose
    advantage is not 0 before whitening: the share of the batch the gradient comes from), and
    `advantages/{mean,std,max,min}` of the result.
    """
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both be [B]; got {tuple(rewards.shape)} and "
            f"{tuple(group_index.shape)}"
        )
    estimator = ADVANTAGES.get(adv_type)
    groups = GroupStats.of(rewards, group_index)
    advantages = estimator(rewards, groups, eps)
    # The group mean of equal floats can be off by an ulp; a zero-signal group must be exactly 0.
    advantages = torch.where(groups.is_constant[groups.row_group], torch.zeros_like(advantages), advantages)
    # Counted before whitening, which moves zero-signal rows off 0 by the batch mean.
    nonzero_fraction = float((advantages != 0).float().mean())
    if normalize:
        advantages = (advantages - advantages.mean()) / (_sample_std(advantages) + eps)
    zero_std_groups = int(groups.is_constant.sum())
    metrics = {
        "advantages/zero_std_groups": float(zero_std_groups),
        "advantages/zero_std_fraction": zero_std_groups / groups.size.numel(),
        "advantages/nonzero_fraction": nonzero_fraction,
        "advantages/mean": float(advantages.mean()),
        "advantages/std": float(_sample_std(advantages)),
        "advantages/max": float(advantages.max()),
        "advantages/min": float(advantages.min()),
    }
    return AdvantageResult(advantages, metrics)


def _sample_std(values: torch.Tensor) -> torch.Tensor:
    """torch.std, except 0 (not NaN) for a single value."""
    if values.numel() < 2:
        return values.new_zeros(())
    return values.std()
