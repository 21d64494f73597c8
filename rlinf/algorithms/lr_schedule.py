"""The LR schedule both actors use, as a multiplier of the base LR per optimizer step."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rlinf.config.schema import Config, LRDecayStyle


def lr_multiplier(
    decay_style: str, warmup_steps: int, decay_steps: int = 0, min_lr_ratio: float = 0.0
) -> Callable[[int], float]:
    """The LR at optimizer step k (from 0) over the peak LR.

    `constant`: always 1. `warmup_constant`: linear warmup to 1 over `warmup_steps`, then 1.
    `cosine`: the same warmup, then a half cosine from 1 down to `min_lr_ratio`, reached at step
    `decay_steps` (counted from step 0, warmup included) and held after it.
    """

    def multiplier(optimizer_step: int) -> float:
        if decay_style == "constant":
            return 1.0
        if warmup_steps > 0 and optimizer_step < warmup_steps:
            return (optimizer_step + 1) / warmup_steps
        if decay_style != "cosine":
            return 1.0
        span = max(1, decay_steps - warmup_steps)
        progress = min(1.0, (optimizer_step - warmup_steps) / span)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return multiplier


def optimizer_steps_per_step(cfg: Config) -> int:
    """Minibatches (optimizer steps) in one GRPO step: the step's responses over the global batch."""
    return cfg.data.rollout_batch_size * cfg.algorithm.group_size // cfg.actor.global_batch_size


def lr_decay_steps(cfg: Config) -> int:
    """`actor.lr_sched.lr_decay_steps`, or the run's optimizer steps (runner.max_steps x minibatches)."""
    given = cfg.actor.lr_sched.lr_decay_steps
    if given is not None:
        return given
    return max(cfg.runner.max_steps, 0) * optimizer_steps_per_step(cfg)


@dataclass(frozen=True)
class ResolvedLRSchedule:
    """The schedule a config trains with, every derived value worked out: what a checkpoint records
    and a resumed run compares. A value the style does not use is None, so that a change to it (say,
    runner.max_steps under a constant LR) is no difference."""

    style: LRDecayStyle
    peak_lr: float
    warmup_steps: int | None  # None: constant
    decay_steps: int | None  # None: no decay (constant, warmup_constant)
    min_lr: float | None  # the floor, peak_lr x min_lr_ratio; None: no decay


def resolved_lr_schedule(cfg: Config) -> ResolvedLRSchedule:
    """The values `lr_multiplier_from_config(cfg)` (both actors' schedule) computes with; what a
    checkpoint records of its schedule (rlinf.runners.lr_resume)."""
    s, peak = cfg.actor.lr_sched, cfg.actor.optim.lr
    if s.lr_decay_style == "constant":
        return ResolvedLRSchedule("constant", peak, None, None, None)
    if s.lr_decay_style == "warmup_constant":
        return ResolvedLRSchedule("warmup_constant", peak, s.lr_warmup_steps, None, None)
    return ResolvedLRSchedule(
        s.lr_decay_style, peak, s.lr_warmup_steps, lr_decay_steps(cfg), peak * s.min_lr_ratio
    )


def lr_multiplier_from_config(cfg: Config) -> Callable[[int], float]:
    s = cfg.actor.lr_sched
    return lr_multiplier(s.lr_decay_style, s.lr_warmup_steps, lr_decay_steps(cfg), s.min_lr_ratio)
