"""Run checkpoints: actor state + data position + step + the LR schedule trained with + resolved
config (+ the groups a partial rollout carries into the next step), saved atomically; resume."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlinf.algorithms.lr_schedule import ResolvedLRSchedule
from rlinf.config.loader import save_resolved_config
from rlinf.config.placement import parse_placement
from rlinf.config.schema import Config
from rlinf.config.typed import ConfigError, to_dict
from rlinf.data.prompt_loader import PromptLoader
from rlinf.runners.lr_resume import RECORD_KEY, lr_schedule_record, read_lr_schedule_record
from rlinf.scheduler.roles import Roles
from rlinf.utils.checkpoint import CheckpointError, CheckpointManager, check_complete, check_weight_files
from rlinf.utils.metrics import MetricLogger
from rlinf.weight_sync import sync_weights
from rlinf.workers.rollout.partial import GroupInFlight, groups_from_json, groups_to_json

logger = logging.getLogger(__name__)

RUNNER_STATE_FILE = "runner_state.json"
CARRIED_GROUPS_FILE = "carried_groups.json"  # data.partial_rollout: the groups the step left unfinished
ACTOR_DIR = "actor"
# Fields that must match for a checkpoint to continue the same run (dotted keys).
RESUME_INVARIANTS = (
    "runner.seed",
    "data.type",
    "data.rollout_batch_size",
    "data.oversample_prompts",
    "data.partial_rollout",
    "data.shuffle",
    "algorithm.group_size",
    "actor.training_backend",
)
# A Megatron checkpoint is sharded by the parallel layout and the ranks that wrote it, and its
# loader does not reshard: the layout must match too. The torch actor's checkpoint is one full
# copy written by rank 0, which any number of workers can load.
LAYOUT_SIZES = (
    ("TP", "actor.model.tensor_model_parallel_size"),
    ("PP", "actor.model.pipeline_model_parallel_size"),
    ("EP", "actor.model.expert_model_parallel_size"),
    ("ETP", "actor.model.expert_tensor_parallel_size"),
    ("CP", "actor.model.context_parallel_size"),
)


def checkpoint_root(cfg: Config) -> Path:
    return Path(cfg.runner.output_dir) / cfg.runner.experiment_name / "checkpoints"


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    step: int  # the run continues after this step
    data_state: dict
    carried: tuple[GroupInFlight, ...] = ()  # data.partial_rollout: the groups for the next step
    # The LR schedule and optimizer steps it recorded (rlinf.runners.lr_resume); None: not recorded
    lr_schedule: tuple[ResolvedLRSchedule, int] | None = None


def find_resume_point(cfg: Config, loader: PromptLoader) -> ResumePoint | None:
    """The checkpoint runner.resume_dir names, checked on the driver before any worker starts:
    complete, readable, from the same run, a data position valid for `loader`, weight files intact.
    None for a fresh run. Raises CheckpointError naming the file and the problem."""
    path = _resume_path(cfg)
    if path is None:
        return None
    check_complete(path)
    state_file = path / RUNNER_STATE_FILE
    try:
        state = json.loads(state_file.read_text())
        step, data_state = int(state["step"]), dict(state["data"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{state_file}: unreadable runner state: {err}") from None
    lr_schedule = read_lr_schedule_record(state, state_file)
    _check_compatible(cfg, path / "resolved_config.yaml")
    try:
        loader.load_state_dict(data_state)
    except ValueError as err:
        raise CheckpointError(f"{state_file}: {err}") from None
    check_weight_files(path / ACTOR_DIR)
    carried = _read_carried(path / CARRIED_GROUPS_FILE) if cfg.data.partial_rollout else ()
    return ResumePoint(path, step, data_state, carried, lr_schedule)


def _read_carried(path: Path) -> tuple[GroupInFlight, ...]:
    try:
        return tuple(groups_from_json(json.loads(path.read_text())))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: unreadable carried groups (data.partial_rollout): {err}") from None


def _resume_path(cfg: Config) -> Path | None:
    resume = cfg.runner.resume_dir
    if resume is None:
        return None
    if resume == "auto":
        root = checkpoint_root(cfg)
        manager = CheckpointManager(root, cfg.runner.keep_checkpoints)
        latest = manager.latest()
        latest_step = _step_of(latest) if latest else -1
        for skipped in manager.incomplete():
            if _step_of(skipped) > latest_step:
                logger.warning(
                    "runner.resume_dir=auto: skipping %s: incomplete (no COMPLETE marker: its save did "
                    "not finish); resuming from %s",
                    skipped,
                    latest or "nothing (starting fresh)",
                )
        if latest is None:
            logger.info("runner.resume_dir=auto: no checkpoint under %s, starting fresh", root)
        return latest
    return Path(resume)


def planned_steps(cfg: Config, loader: PromptLoader) -> int:
    """The step this run ends after: runner.max_steps, or fewer when runner.max_epochs ends first."""
    by_epochs = loader.steps_per_epoch * cfg.runner.max_epochs
    return min(by_epochs, cfg.runner.max_steps) if cfg.runner.max_steps > 0 else by_epochs


def steps_left(cfg: Config, point: ResumePoint, loader: PromptLoader) -> int:
    """Steps a resumed run will train; a checkpoint already past the run's end is refused."""
    last = planned_steps(cfg, loader)
    if point.step > last:
        bound = (
            f"runner.max_steps={cfg.runner.max_steps}"
            if cfg.runner.max_steps > 0 and last == cfg.runner.max_steps
            else f"runner.max_epochs={cfg.runner.max_epochs} ({last} steps)"
        )
        raise ConfigError(
            f"{bound}, but the checkpoint to resume, {point.path}, is already at step {point.step}: "
            f"this run would train nothing. Raise runner.max_steps above {point.step} to continue it"
        )
    return last - point.step


def last_good_checkpoint(
    checkpointer: RunCheckpointer | None, point: ResumePoint | None, failure: BaseException | None
) -> Path | str | None:
    """What a stopped run names as its last good checkpoint. While resuming, before the checkpoint was
    restored: the resume checkpoint itself, unless it is what failed (a CheckpointError from a
    worker's load); then the newest complete checkpoint before it."""
    if checkpointer is not None and checkpointer.last_saved is not None:
        return checkpointer.last_saved
    if point is None:
        return None
    if not isinstance(getattr(failure, "__cause__", None), CheckpointError):
        return point.path
    earlier = [
        c for c in CheckpointManager(point.path.parent, keep=1).checkpoints() if _step_of(c) < point.step
    ]
    if earlier:
        return f"{earlier[-1]} (the resume checkpoint {point.path} could not be loaded)"
    return f"none (the resume checkpoint {point.path} could not be loaded, and no complete one precedes it)"


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("step_"))


def _check_compatible(cfg: Config, config_file: Path) -> None:
    try:
        saved = yaml.safe_load(config_file.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise CheckpointError(f"{config_file}: unreadable: {err}") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{config_file}: not a resolved config (expected a mapping)")
    current, defaults = to_dict(cfg), to_dict(Config())
    for key in RESUME_INVARIANTS:
        old, new = _dotted(saved, key), _dotted(current, key)
        if old is None:  # a checkpoint written before the key existed ran with its default
            old = _dotted(defaults, key)
        if old != new:
            raise CheckpointError(
                f"{config_file}: incompatible checkpoint: {key} was {old!r}, this run has {new!r}"
            )
    if cfg.actor.training_backend == "megatron":
        old_layout, new_layout = actor_layout(saved), actor_layout(current)
        if old_layout != new_layout:
            raise CheckpointError(
                f"{config_file}: incompatible checkpoint: it was written at the parallel layout "
                f"{old_layout}, this run has {new_layout}; a Megatron checkpoint resumes only at the layout "
                "that wrote it (set actor.model.* and cluster.component_placement as saved)"
            )


def _dotted(tree: dict, key: str) -> object:
    value: object = tree
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def actor_layout(resolved: dict) -> str:
    """'TP=2 PP=1 EP=2 ETP=1 CP=1 on 4 actor ranks' from a resolved config (as saved with a checkpoint)."""
    sizes = " ".join(f"{name}={_dotted(resolved, key)}" for name, key in LAYOUT_SIZES)
    cluster = resolved.get("cluster") or {}
    try:
        gpus = int(cluster.get("num_nodes") or 1) * int(cluster.get("num_gpus_per_node") or 0)
        ranks: object = max(len(parse_placement(cluster["component_placement"], gpus).gpus["actor"]), 1)
    except (ConfigError, KeyError, TypeError, ValueError, AttributeError):
        ranks = "?"
    return f"{sizes} on {ranks} actor rank(s)"


class RunCheckpointer:
    def __init__(
        self,
        cfg: Config,
        roles: Roles,
        loader: PromptLoader,
        metrics: MetricLogger,
        data_position: Callable[[], dict] | None = None,
    ) -> None:
        self.cfg = cfg
        self.roles = roles
        self.loader = loader
        # The data state a save records: the loader's, or (runner.max_staleness) that of the first
        # batch drawn ahead and not trained yet, which a resumed run draws again.
        self.data_position = data_position or loader.state_dict
        self.metrics = metrics
        self.manager = CheckpointManager(checkpoint_root(cfg), cfg.runner.keep_checkpoints)
        self.last_saved: Path | None = None  # this run's last complete save (or the one it resumed from)
        self.last_saved_step: int | None = None

    def save(self, step: int, carried: Sequence[GroupInFlight] = ()) -> Path:
        """One save per step: a step already saved by this run returns that checkpoint unchanged.
        `carried`: the groups a partial rollout carries into step + 1."""
        if self.last_saved is not None and self.last_saved_step == step:
            return self.last_saved

        def write(tmp: Path) -> None:
            optimizer_steps = self.roles.actor.save(str(tmp / ACTOR_DIR))  # collective: every rank writes
            state = {
                "step": step,
                "data": self.data_position(),
                RECORD_KEY: lr_schedule_record(self.cfg, optimizer_steps),
            }
            (tmp / RUNNER_STATE_FILE).write_text(json.dumps(state, indent=1))
            if self.cfg.data.partial_rollout:
                (tmp / CARRIED_GROUPS_FILE).write_text(json.dumps(groups_to_json(carried)))
            save_resolved_config(self.cfg, tmp)

        self.last_saved = self.manager.save(step, write)
        self.last_saved_step = step
        logger.info("saved checkpoint %s", self.last_saved)
        return self.last_saved

    def maybe_resume(
        self, in_memory_order: Callable[[Callable[[], object]], None]
    ) -> tuple[int, list[GroupInFlight]]:
        """Restore the run from runner.resume_dir; returns the step it continues after (0 = fresh)
        and the groups a partial rollout carried out of that step.
        `in_memory_order(sync)` runs the weight sync in the colocated memory order (the runner's
        ColocatedMemory.sync_after_load)."""
        point = find_resume_point(self.cfg, self.loader)  # also restores the loader's position
        if point is None:
            return 0, []
        self.roles.actor.load(str(point.path / ACTOR_DIR))  # collective: every rank restores
        in_memory_order(lambda: sync_weights(self.roles, self.cfg.rollout.weight_sync_bucket_mb))
        self.metrics.truncate_after(point.step)
        self.last_saved, self.last_saved_step = point.path, point.step
        d = point.data_state
        print(
            f"resumed from {point.path} at step {point.step} "
            f"(data epoch {d['epoch']}, index {d['index']}); continuing with step {point.step + 1}",
            flush=True,
        )
        return point.step, list(point.carried)
