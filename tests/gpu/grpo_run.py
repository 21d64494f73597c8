"""Run the tiny recipe through examples/reasoning/main_grpo.py with GPU backends, for the GPU tier's
end-to-end tests: the run must exit 0, write a TensorBoard event file, and log `steps` train steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
    cmd = [
        sys.executable,
        str(ROOT / "examples/reasoning/main_grpo.py"),
        "tiny-moe-grpo-cpu",
        *common,
        *overrides,
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    figures = os.environ.get("RLINF_GPU_FIGURES")
    if figures:  # the whole log next to the figures: a lent GPU's $OUT brings it back
        log = Path(figures).parent / f"{tmp_path.name}.log"
        log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    tail = (done.stdout + done.stderr)[-5000:]
    assert done.returncode == 0, tail
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if r.get("step", 0) >= 1 and step_key in r]
    assert len(step_rows) == steps, tail
    assert list(log_dir.glob("events.out.tfevents.*")), "no TensorBoard event file"
    for key in required:
        assert all(key in r for r in step_rows), f"{key} missing: {sorted(step_rows[0])}"
    return step_rows
