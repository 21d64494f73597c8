"""Metric sinks: TensorBoard event files, wandb (optional), a JSONL history (for plots and resume),
a console line."""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlinf.utils.wandb_sink import WandbRun

HISTORY_FILE = "metrics.jsonl"


class MetricLogger:
    def __init__(
        self,
        log_path: str | Path,
        backends: tuple[str, ...] = ("tensorboard",),
        wandb_run: WandbRun | None = None,
    ) -> None:
        """`wandb_run`: the run's settings, needed when `backends` includes wandb."""
        self.log_path = Path(log_path)
        self.log_path.mkdir(parents=True, exist_ok=True)
        self.writer = None
        if "tensorboard" in backends:
            self.writer = self._tensorboard()
        self.wandb = None
        if "wandb" in backends:
            if wandb_run is None:
                raise ValueError("the wandb metric sink needs the run's settings (wandb_run)")
            from rlinf.utils.wandb_sink import WandbSink

            self.wandb = WandbSink(wandb_run, self.log_path)
        self.history_path = self.log_path / HISTORY_FILE

    def _tensorboard(self, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(self.log_path), purge_step=purge_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        if self.writer is not None:
            for key, value in clean.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(clean, step)
        with self.history_path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")

    def history(self) -> list[dict[str, float]]:
        if not self.history_path.is_file():
            return []
        return [json.loads(line) for line in self.history_path.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        """On resume: drop history rows of steps the resumed run will redo, and tell TensorBoard
        to drop its points from step + 1 on (a purge marker in a new event file), so a redone step
        shows once, with the resumed run's value."""
        kept = [row for row in self.history() if row["step"] <= step]
        self.history_path.write_text("".join(json.dumps(row) + "\n" for row in kept))
        if self.writer is not None:
            self.writer.close()
            self.writer = self._tensorboard(purge_step=step + 1)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None


class PhaseTimer:
    """Wall time per phase of a step, reported as time/<phase> (seconds)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"time/{name}"] = self.times.get(f"time/{name}", 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        times, self.times = self.times, {}
        return times


def progress_line(step: int, max_steps: int, metrics: dict[str, float], elapsed: float) -> str:
    def fmt(key: str, label: str, spec: str = ".3f") -> str:
        return f"{label} {metrics[key]:{spec}}" if key in metrics else ""

    parts = [
        f"step {step}/{max_steps}",
        fmt("rollout/reward_mean", "reward", "+.2f"),
        fmt("rollout/accuracy", "acc"),
        fmt("val/accuracy", "val_acc"),
        fmt("rollout/response_length_mean", "len", ".1f"),
        fmt("actor/policy_loss", "loss", "+.4f"),
        fmt("rollout/logprob_abs_diff", "|dlogp|", ".1e"),
        fmt("time/step", "step_s", ".1f"),
        f"elapsed {elapsed:.0f}s",
    ]
    return " | ".join(p for p in parts if p)
