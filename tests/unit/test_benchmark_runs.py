"""Recipe runs started by a benchmark (benchmarks/_common.py) or a GPU test (tests/gpu/grpo_run.py)
end with it when a caller's `timeout` stops it (each run has a process group of its own, so the SIGTERM
would not reach it), and `kill_run` leaves nothing of a run's group behind. Real processes."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import _common

ROOT = Path(__file__).parents[2]
_spec = importlib.util.spec_from_file_location("grpo_run", ROOT / "tests" / "gpu" / "grpo_run.py")
grpo_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grpo_run)

BENCHMARK = """
import subprocess, sys, time
from benchmarks import _common
run = subprocess.Popen(["sleep", "300"], process_group=0)  # stands for a recipe run: its own group
_common._STARTED.append(run)
_common.stop_runs_on_sigterm()
print(run.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sigterm_to_the_benchmark_stops_the_runs_it_started():
    bench = subprocess.Popen([sys.executable, "-c", BENCHMARK], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    run_pid = int(bench.stdout.readline())
    assert _alive(run_pid)
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=30) == 128 + signal.SIGTERM
    assert _gone(run_pid)


# A run whose driver starts a helper that ignores SIGTERM (as a stuck worker may), prints, then waits
HANGS = """
import subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(sys.argv[1], "w").write(str(helper.pid))
print("step 1 done", flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    for _ in range(100):
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _hanging_run(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    pid_file, log = tmp_path / "helper.pid", tmp_path / "run.log"
    with log.open("w") as out:
        run = subprocess.Popen(
            [sys.executable, "-c", HANGS, str(pid_file)],
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    return run, pid_file, log


def _helper_pid(pid_file: Path) -> int:
    for _ in range(600):
        if pid_file.exists() and pid_file.read_text():
            return int(pid_file.read_text())
        time.sleep(0.05)
    raise AssertionError("the run never started its helper")


def test_kill_run_stops_a_worker_that_outlives_the_driver(tmp_path):
    run, pid_file, _ = _hanging_run(tmp_path)
    helper = _helper_pid(pid_file)
    _common.kill_run(run, drain_seconds=1)  # the driver ends on the SIGTERM, the helper ignores it
    assert _gone(helper), "the run's helper process outlived kill_run"


def test_a_gpu_test_run_past_its_timeout_fails_with_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(grpo_run, "DRAIN_SECONDS", 1)
    run, pid_file, log = _hanging_run(tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)did not end within 3 s.*step 1 done"):
        grpo_run._wait(run, log, timeout=3)
    assert _gone(_helper_pid(pid_file)), "the run's helper process outlived the timeout"


# The GPU test's process itself, told to stop while its run goes on (an outer `timeout`'s SIGTERM)
GPU_TEST = """
import subprocess, sys
sys.path.insert(0, "tests/gpu")
import grpo_run
grpo_run.DRAIN_SECONDS = 1
log = open(sys.argv[3], "w")
run = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=log, process_group=0)
grpo_run._wait(run, grpo_run.Path(sys.argv[3]), timeout=600)
"""


def test_a_gpu_test_stopped_by_sigterm_stops_its_run_first(tmp_path):
    pid_file = tmp_path / "helper.pid"
    args = [HANGS, str(pid_file), str(tmp_path / "run.log")]
    test = subprocess.Popen(
        [sys.executable, "-c", GPU_TEST, *args], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    helper = _helper_pid(pid_file)
    test.send_signal(signal.SIGTERM)
    _, err = test.communicate(timeout=30)
    assert "KeyboardInterrupt" in err
    assert _gone(helper), "the run's helper process outlived the GPU test"
