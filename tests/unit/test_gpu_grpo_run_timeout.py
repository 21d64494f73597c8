"""The GPU tier's end-to-end runs (tests/gpu/grpo_run.py) on a run that never ends: the test fails with
the log the run wrote up to then, and the run's whole process group is gone (a Ray or engine process
left behind would hold the GPU the next test needs). Real processes; no GPU needed."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "gpu" / "grpo_run.py"
spec = importlib.util.spec_from_file_location("grpo_run", SCRIPT)
grpo_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grpo_run)

# A driver that starts a helper which ignores SIGTERM (as a stuck worker may), prints, then waits
HANGS = """
import subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(sys.argv[1], "w").write(str(helper.pid))
print("step 1 done", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_run_past_its_timeout_fails_with_its_log_and_leaves_no_process(tmp_path, monkeypatch):
    monkeypatch.delenv("RLINF_GPU_FIGURES", raising=False)
    monkeypatch.setattr(grpo_run, "DRAIN_SECONDS", 1)
    pid_file = tmp_path / "helper.pid"
    log = grpo_run._run_log(tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)did not end within 3 s.*step 1 done"):
        grpo_run._run([sys.executable, "-c", HANGS, str(pid_file)], log, timeout=3)
    helper = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(helper), "the run's helper process outlived the timeout"


def test_a_finished_run_returns_its_status_and_keeps_its_log(tmp_path, monkeypatch):
    figures = tmp_path / "out" / "figures.jsonl"
    figures.parent.mkdir()
    monkeypatch.setenv("RLINF_GPU_FIGURES", str(figures))
    log = grpo_run._run_log(tmp_path)
    assert log.parent == figures.parent
    code = "import sys; print('done'); sys.exit(3)"
    assert grpo_run._run([sys.executable, "-c", code], log, timeout=30) == 3
    assert log.read_text() == "done\n"


# The test process itself, told to stop while the run is going (an outer `timeout`'s SIGTERM)
TEST_PROCESS = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("grpo_run", sys.argv[1])
grpo_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grpo_run)
grpo_run.DRAIN_SECONDS = 1
grpo_run._run([sys.executable, "-c", sys.argv[2], sys.argv[3]], grpo_run.Path(sys.argv[4]), timeout=600)
"""


def test_a_test_stopped_by_sigterm_stops_its_run_first(tmp_path):
    pid_file = tmp_path / "helper.pid"
    args = [str(SCRIPT), HANGS, str(pid_file), str(tmp_path / "run.log")]
    tester = subprocess.Popen([sys.executable, "-c", TEST_PROCESS, *args], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and tester.poll() is None, tester.stderr.read()
        time.sleep(0.05)
    tester.send_signal(signal.SIGTERM)
    _, err = tester.communicate(timeout=30)
    assert "KeyboardInterrupt" in err
    helper = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(helper), "the run's helper process outlived the test process"
