"""run_all.sh runs the Megatron modes' checks without the benchmarks those modes run after them
(CHECKS_ONLY=1); run_megatron_checks.sh alone still runs both. The real scripts, with a stand-in
python3 that logs each command it is given (no GPU here) and hands run_all_summary.py to Python."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).parents[1] / "gpu"
# run_megatron_checks.sh mode: (its run_all suite, the benchmark the mode runs after its checks)
MODES = {
    "actor": ("megatron-actor", "benchmarks.logprob_kernels"),
    "pack": ("pack", "benchmarks.packed_micro_batches"),
    "graphs": ("cuda-graphs", "benchmarks.actor_throughput"),
}

# A stand-in python3: run_all_summary.py goes to Python, every other command runs `body` instead
STAND_IN = """#!/usr/bin/env bash
case "$1" in
  *run_all_summary.py) exec {python} "$@" ;;
esac
{body}
"""
PASSES = 'echo "$*" >> "$LEDGER"\necho "1 passed in 0.10s"'


def _repo(root: Path, body: str = PASSES) -> dict[str, str]:
    (root / "tests/gpu").mkdir(parents=True)
    for name in ("run_all.sh", "run_all_summary.py", "provision.sh", "run_megatron_checks.sh"):
        shutil.copy(GPU_DIR / name, root / "tests/gpu" / name)
    (root / "bin").mkdir()
    python = root / "bin/python3"
    python.write_text(STAND_IN.format(python=sys.executable, body=body))
    python.chmod(0o755)
    (root / "tmp").mkdir()
    return {
        "PATH": f"{root / 'bin'}:/usr/bin:/bin",
        "LEDGER": str(root / "ledger"),
        "TMPDIR": str(root / "tmp"),
        "OUT": str(root / "out"),
        "HOME": str(root),
    }


def _script(root: Path, env: dict[str, str], script: str, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / "tests/gpu" / script), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _commands(root: Path, env: dict[str, str], script: str, mode: str) -> str:
    ledger = root / "ledger"
    ledger.unlink(missing_ok=True)
    done = _script(root, env, script, mode)
    assert done.returncode == 0, done.stdout + done.stderr
    return ledger.read_text()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_run_all_runs_the_checks_without_the_benchmarks(tmp_path, mode):
    suite, benchmark = MODES[mode]
    env = _repo(tmp_path)
    alone = _commands(tmp_path, env, "run_megatron_checks.sh", mode)
    assert "-m pytest" in alone and benchmark in alone  # the mode by itself: both
    in_run_all = _commands(tmp_path, env, "run_all.sh", suite)
    assert "-m pytest" in in_run_all
    assert "benchmarks." not in in_run_all


FAILS = 'echo "the run\'s own log" > "$OUT/run-of-this-suite.log"\necho "1 failed in 0.10s"\nexit 1'


def test_a_failed_suite_brings_back_its_own_logs_and_only_them(tmp_path):
    env = _repo(tmp_path, FAILS)
    earlier = tmp_path / "tmp/megatron-checks/an-earlier-suite.log"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("from before")
    os.utime(earlier, (1, 1))
    assert _script(tmp_path, env, "run_all.sh", "megatron-grpo").returncode != 0
    logs = tmp_path / "out/megatron-grpo-logs"
    assert sorted(p.name for p in logs.iterdir()) == ["run-of-this-suite.log"]
    assert (logs / "run-of-this-suite.log").read_text() == "the run's own log\n"
