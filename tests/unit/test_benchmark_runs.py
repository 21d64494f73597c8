"""benchmarks/_common.py: recipe runs a benchmark starts end with it when a caller's `timeout` stops it
(each run has a process group of its own, so the SIGTERM would not reach it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[2]

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
    for _ in range(50):
        if not _alive(run_pid):
            break
        time.sleep(0.1)
    assert not _alive(run_pid)
