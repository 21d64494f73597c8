"""Run the tiny recipe through examples/reasoning/main_grpo.py with GPU backends, for the GPU tier's
end-to-end tests: the run must exit 0, write a TensorBoard event file, and log `steps` train steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from benchmarks._common import kill_run, start_recipe

DRAIN_SECONDS = 10  # after SIGTERM, the run's own drain and shutdown (Ray, the engine) before SIGKILL


def _run_log(tmp_path: Path) -> Path:
    """Where the run's output goes as it is written: next to the figures when a lent GPU's $OUT brings
    them back, so a run that hangs or times out still leaves its log."""
    figures = os.environ.get("RLINF_GPU_FIGURES")
    return Path(figures).parent / f"{tmp_path.name}.log" if figures else tmp_path / "run.log"


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # pytest ends the session; _wait's finally stops the run


def _wait(run: subprocess.Popen, log: Path, timeout: int) -> int:
    """The exit status of `run` (started in a process group of its own). When it outlives `timeout`, or
    pytest is told to stop (an outer `timeout`'s SIGTERM), the whole group is stopped, so no Ray or
    engine process keeps the GPU from the next test, and the test fails with the log's tail."""
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        return run.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if run.returncode is None:
            kill_run(run, DRAIN_SECONDS)
    pytest.fail(f"the run did not end within {timeout} s; the end of {log}:\n{log.read_text()[-5000:]}")


def run_tiny_grpo(
    tmp_path: Path,
    overrides: list[str],
    *,
    steps: int,
    step_key: str,
    required: tuple[str, ...],
    timeout: int,
) -> list[dict]:
    """The metrics rows of the run's train steps (rows >= step 1 carrying `step_key`)."""
    log_dir = tmp_path / "logs"
    common = [
        "cluster.num_gpus_per_node=1",
        f"runner.max_steps={steps}",
        "runner.val_check_interval=0",
        "runner.save_interval=0",
        f"runner.output_dir={tmp_path / 'results'}",
        f"runner.logger.log_path={log_dir}",
        "runner.logger.plot=false",
    ]
    log = _run_log(tmp_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    returncode = _wait(start_recipe("tiny-moe-grpo-cpu", [*common, *overrides], log, env=env), log, timeout)
    tail = log.read_text()[-5000:]
    assert returncode == 0, tail
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if r.get("step", 0) >= 1 and step_key in r]
    assert len(step_rows) == steps, tail
    assert list(log_dir.glob("events.out.tfevents.*")), "no TensorBoard event file"
    for key in required:
        assert all(key in r for r in step_rows), f"{key} missing: {sorted(step_rows[0])}"
    return step_rows
