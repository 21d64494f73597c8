"""Run checkpoints: actor state + data position + step + resolved config, saved atomically; resume."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlinf.config.loader import save_resolved_config
from rlinf.config.schema import Config
from rlinf.config.typed import to_dict
from rlinf.data.loader import PromptLoader
from rlinf.scheduler.roles import Roles
from rlinf.utils.checkpoint import CheckpointError, CheckpointManager, check_complete, check_weight_files
from rlinf.utils.metrics import MetricLogger
from rlinf.weight_sync import sync_weights

logger = logging.getLogger(__name__)

RUNNER_STATE_FILE = "runner_state.json"
ACTOR_DIR = "actor"
# Fields that must match for a checkpoint to continue the same run.
RESUME_INVARIANTS = (
    ("runner", "seed"),
    ("data", "type"),
    ("data", "rollout_batch_size"),
    ("data", "shuffle"),
    ("algorithm", "group_size"),
    ("actor", "training_backend"),
)


def checkpoint_root(cfg: Config) -> Path:
    return Path(cfg.runner.output_dir) / cfg.runner.experiment_name / "checkpoints"


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    step: int  # the run continues after this step
    data_state: dict


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
    _check_compatible(cfg, path / "resolved_config.yaml")
    try:
        loader.load_state_dict(data_state)
    except ValueError as err:
        raise CheckpointError(f"{state_file}: {err}") from None
    check_weight_files(path / ACTOR_DIR)
    return ResumePoint(path, step, data_state)


def _resume_path(cfg: Config) -> Path | None:
    resume = cfg.runner.resume_dir
    if resume is None:
        return None
    if resume == "auto":
        root = checkpoint_root(cfg)
        latest = CheckpointManager(root, cfg.runner.keep_checkpoints).latest()
        if latest is None:
            logger.info("runner.resume_dir=auto: no checkpoint under %s, starting fresh", root)
        return latest
    return Path(resume)


def _check_compatible(cfg: Config, config_file: Path) -> None:
    try:
        saved = yaml.safe_load(config_file.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise CheckpointError(f"{config_file}: unreadable: {err}") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{config_file}: not a resolved config (expected a mapping)")
    current = to_dict(cfg)
    for section, key in RESUME_INVARIANTS:
        old = (saved.get(section) or {}).get(key)
        new = current[section][key]
        if old != new:
            raise CheckpointError(
                f"{config_file}: incompatible checkpoint: {section}.{key} was {old!r}, this run has {new!r}"
            )


class RunCheckpointer:
    def __init__(self, cfg: Config, roles: Roles, loader: PromptLoader, metrics: MetricLogger) -> None:
        self.cfg = cfg
        self.roles = roles
        self.loader = loader
        self.metrics = metrics
        self.manager = CheckpointManager(checkpoint_root(cfg), cfg.runner.keep_checkpoints)
        self.last_saved: Path | None = None  # this run's last complete save (or the one it resumed from)
        self.last_saved_step: int | None = None

    def save(self, step: int) -> Path:
        """One save per step: a step already saved by this run returns that checkpoint unchanged."""
        if self.last_saved is not None and self.last_saved_step == step:
            return self.last_saved

        def write(tmp: Path) -> None:
            self.roles.actor.save(str(tmp / ACTOR_DIR))  # collective: every rank writes its shard
            state = {"step": step, "data": self.loader.state_dict()}
            (tmp / RUNNER_STATE_FILE).write_text(json.dumps(state, indent=1))
            save_resolved_config(self.cfg, tmp)

        self.last_saved = self.manager.save(step, write)
        self.last_saved_step = step
        logger.info("saved checkpoint %s", self.last_saved)
        return self.last_saved

    def maybe_resume(self) -> int:
        """Restore the run from runner.resume_dir; returns the step it continues after (0 = fresh)."""
        point = find_resume_point(self.cfg, self.loader)  # also restores the loader's position
        if point is None:
            return 0
        self.roles.actor.load(str(point.path / ACTOR_DIR))  # collective: every rank restores
        sync_weights(self.roles, self.cfg.rollout.weight_sync_bucket_mb)
        self.metrics.truncate_after(point.step)
        self.last_saved, self.last_saved_step = point.path, point.step
        d = point.data_state
        print(
            f"resumed from {point.path} at step {point.step} "
            f"(data epoch {d['epoch']}, index {d['index']}); continuing with step {point.step + 1}",
            flush=True,
        )
        return point.step
