"""The LR schedule across a resume.

A checkpoint records the schedule its run trained with, resolved from its config (style, peak LR,
warmup, decay length, floor) with the optimizer steps taken. A resumed run resolves its own config
the same way and compares, on the driver before Ray starts. A recipe whose decay length comes from
runner.max_steps changes its schedule when a run is extended, so the comparison catches the common
case. On a difference the run stops, unless actor.lr_sched.on_resume says which schedule to follow:
`use_checkpoint` keeps the recorded one, `override` takes this run's from the recorded optimizer
step on (Megatron-LM's --use-checkpoint-opt_param-scheduler and --override-opt_param-scheduler).

Both actors follow the config they are given (rlinf.algorithms.lr_schedule), so keeping the
checkpoint's schedule means training with a config that holds it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import get_args

from rlinf.algorithms.lr_schedule import ResolvedLRSchedule, resolved_lr_schedule
from rlinf.config.schema import Config, LRDecayStyle
from rlinf.config.typed import ConfigError
from rlinf.utils.checkpoint import CheckpointError

logger = logging.getLogger(__name__)

RECORD_KEY = "lr_schedule"  # in the checkpoint's runner_state.json
STEPS_KEY = "optimizer_steps"
# Where each resolved value comes from, for messages.
SOURCES = {
    "style": "actor.lr_sched.lr_decay_style",
    "peak_lr": "actor.optim.lr",
    "warmup_steps": "actor.lr_sched.lr_warmup_steps",
    "decay_steps": "actor.lr_sched.lr_decay_steps; null: runner.max_steps x optimizer steps per step",
    "min_lr": "actor.optim.lr x actor.lr_sched.min_lr_ratio",
}


def lr_schedule_record(cfg: Config, optimizer_steps: int) -> dict:
    """What a checkpoint records: the resolved schedule and the optimizer steps it has taken."""
    return {**asdict(resolved_lr_schedule(cfg)), STEPS_KEY: optimizer_steps}


def read_lr_schedule_record(state: dict, state_file: Path) -> tuple[ResolvedLRSchedule, int] | None:
    """The schedule and optimizer steps a checkpoint's runner state records; None for a checkpoint
    written before they were recorded."""
    record = state.get(RECORD_KEY)
    if record is None:
        return None
    try:
        schedule = ResolvedLRSchedule(**{f.name: record[f.name] for f in fields(ResolvedLRSchedule)})
        steps = int(record[STEPS_KEY])
        if schedule.style not in get_args(LRDecayStyle):
            raise ValueError(f"unknown style {schedule.style!r}")
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{state_file}: unreadable {RECORD_KEY}: {err!r}") from None
    return schedule, steps


def schedule_differences(recorded: ResolvedLRSchedule, current: ResolvedLRSchedule) -> list[str]:
    """'key: <checkpoint's> in the checkpoint, <this run's> in this run (source)' for each value that
    differs; floats within a relative 1e-9 are equal (a floor kept from a checkpoint is re-derived
    through a division)."""
    found = []
    for f in fields(ResolvedLRSchedule):
        old, new = getattr(recorded, f.name), getattr(current, f.name)
        if isinstance(old, float) and isinstance(new, float) and math.isclose(old, new, rel_tol=1e-9):
            continue
        if old != new:
            found.append(f"{f.name}: {old} in the checkpoint, {new} in this run ({SOURCES[f.name]})")
    return found


def with_lr_schedule(cfg: Config, schedule: ResolvedLRSchedule) -> Config:
    """`cfg` changed so that it resolves to `schedule`; values the style does not use stay as given."""
    s = cfg.actor.lr_sched
    min_lr_ratio = s.min_lr_ratio
    if schedule.min_lr is not None and schedule.peak_lr > 0:
        min_lr_ratio = schedule.min_lr / schedule.peak_lr
    lr_sched = replace(
        s,
        lr_decay_style=schedule.style,
        lr_warmup_steps=s.lr_warmup_steps if schedule.warmup_steps is None else schedule.warmup_steps,
        lr_decay_steps=s.lr_decay_steps if schedule.decay_steps is None else schedule.decay_steps,
        min_lr_ratio=min_lr_ratio,
    )
    optim = replace(cfg.actor.optim, lr=schedule.peak_lr)
    return replace(cfg, actor=replace(cfg.actor, optim=optim, lr_sched=lr_sched))


def config_on_resume(
    cfg: Config, recorded: tuple[ResolvedLRSchedule, int] | None, checkpoint: Path
) -> Config:
    """The config a run resumed from `checkpoint` trains with; logs one line saying which LR schedule
    it follows. Raises ConfigError when the schedules differ and actor.lr_sched.on_resume is error."""
    if recorded is None:
        logger.warning(
            "%s does not record its LR schedule (it was written before checkpoints did): this run "
            "follows its own config's schedule from the restored optimizer step, unchecked",
            checkpoint,
        )
        return cfg
    schedule, steps = recorded
    differences = schedule_differences(schedule, resolved_lr_schedule(cfg))
    choice = cfg.actor.lr_sched.on_resume
    if not differences:
        logger.info("LR schedule: the checkpoint's, continued from optimizer step %d (%s)", steps, schedule)
        return cfg
    listed = "; ".join(differences)
    if choice == "error":
        raise ConfigError(
            f"runner.resume_dir: this run's LR schedule differs from the one {checkpoint} recorded: "
            f"{listed}. Set actor.lr_sched.on_resume=use_checkpoint to keep the checkpoint's schedule, "
            f"or actor.lr_sched.on_resume=override to follow this run's from optimizer step {steps} on"
        )
    if choice == "use_checkpoint":
        logger.info(
            "actor.lr_sched.on_resume=use_checkpoint: keeping the checkpoint's LR schedule from optimizer "
            "step %d, not this run's config (%s)",
            steps,
            listed,
        )
        return with_lr_schedule(cfg, schedule)
    logger.info(
        "actor.lr_sched.on_resume=override: following this run's LR schedule from optimizer step %d, "
        "not the checkpoint's (%s)",
        steps,
        listed,
    )
    return cfg
