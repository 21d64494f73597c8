"""The wandb metric sink (runner.logger.logger_backends: [..., wandb]): one wandb run per launch, with
the resolved config as its run config. wandb is an optional extra (requirements/wandb.txt), imported
only when chosen; WANDB_MODE=offline writes the run under <log_path>/wandb (or WANDB_DIR) for a
later `wandb sync`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WandbRun:
    project: str
    name: str
    tags: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)  # the resolved recipe


class WandbSink:
    def __init__(self, run: WandbRun, log_path: Path) -> None:
        import wandb

        self.run = wandb.init(
            project=run.project,
            name=run.name,
            tags=list(run.tags),
            config=run.config,
            # WANDB_DIR, when set, is where the user keeps wandb's files; else beside the run's logs.
            dir=None if os.environ.get("WANDB_DIR") else str(log_path),
            # wandb's stdout capture would wrap the driver's console (Ray's worker logs go through it).
            settings=wandb.Settings(console="off"),
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        """A resumed run is a new wandb run: its first step may be below what an earlier run logged."""
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()
