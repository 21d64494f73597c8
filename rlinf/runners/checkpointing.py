"""Run checkpoints: actor state + data position + step + resolved config, saved atomically; resume."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import yaml

from rlinf.config.loader import save_resolved_config
from rlinf.config.schema import Config
from rlinf.config.typed import to_dict
from rlinf.data.loader import PromptLoader
from rlinf.scheduler.roles import Roles
from rlinf.utils.checkpoint import CheckpointError, CheckpointManager, check_complete
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
    ("algorithm", "group_size"),
    ("actor", "training_backend"),
)


def checkpoint_root(cfg: Config) -> Path:
    return Path(cfg.runner.output_dir) / cfg.runner.experiment_name / "checkpoints"


class RunCheckpointer:
    def __init__(self, cfg: Config, roles: Roles, loader: PromptLoader, metrics: MetricLogger) -> None:
        self.cfg = cfg
        self.roles = roles
        self.loader = loader
        self.metrics = metrics
        self.manager = CheckpointManager(checkpoint_root(cfg), cfg.runner.keep_checkpoints)
        self.last_saved: Path | None = None  # this run's last complete save (or the one it resumed from)

    def save(self, step: int) -> Path:
        def write(tmp: Path) -> None:
            self.roles.actor.call_rank0("save", str(tmp / ACTOR_DIR))
            state = {"step": step, "data": self.loader.state_dict()}
            (tmp / RUNNER_STATE_FILE).write_text(json.dumps(state, indent=1))
            save_resolved_config(self.cfg, tmp)

        self.last_saved = self.manager.save(step, write)
        logger.info("saved checkpoint %s", self.last_saved)
        return self.last_saved

    def resume_path(self) -> Path | None:
        resume = self.cfg.runner.resume_dir
        if resume is None:
            return None
        if resume == "auto":
            latest = self.manager.latest()
            if latest is None:
                logger.info(
                    "runner.resume_dir=auto: no checkpoint under %s, starting fresh", self.manager.root
                )
            return latest
        return Path(resume)

    def maybe_resume(self) -> int:
        """Restore the run from runner.resume_dir; returns the step it continues after (0 = fresh)."""
        path = self.resume_path()
        if path is None:
            return 0
        check_complete(path)
        state_file = path / RUNNER_STATE_FILE
        try:
            state = json.loads(state_file.read_text())
            step, data_state = int(state["step"]), state["data"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{state_file}: unreadable runner state: {err}") from None
        self._check_compatible(path / "resolved_config.yaml")
        try:
            self.loader.load_state_dict(data_state)
        except ValueError as err:
            raise CheckpointError(f"{state_file}: {err}") from None
        self.roles.actor.call_rank0("load", str(path / ACTOR_DIR))
        sync_weights(self.roles, self.cfg.rollout.weight_sync_bucket_mb)
        self.metrics.truncate_after(step)
        self.last_saved = path
        print(f"resumed from {path} at step {step}", flush=True)
        return step

    def _check_compatible(self, config_file: Path) -> None:
        try:
            saved = yaml.safe_load(config_file.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise CheckpointError(f"{config_file}: unreadable: {err}") from None
        current = to_dict(self.cfg)
        for section, key in RESUME_INVARIANTS:
            old = (saved.get(section) or {}).get(key)
            new = current[section][key]
            if old != new:
                raise CheckpointError(
                    f"{config_file}: incompatible checkpoint: {section}.{key} was {old!r}, this run has {new!r}"
                )
