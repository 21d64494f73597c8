"""benchmarks/pyspy_summary.py: samples are attributed to the innermost process of a
--subprocesses stack, filtered by process and by a function on the stack (bare or qualified), and
counted inclusive / exclusive / by the frame right below that function; gzip reads the same."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.pyspy_summary import frame_name, summarize

MAIN = 'process 10:"python3 bench.py"'
SCHED = 'process 11:"python3 -c from multiprocessing.spawn import spawn_main"'
LINES = [
    f"{MAIN};main (bench.py:3);wait (bench.py:9) 5\n",
    f"{MAIN};{SCHED};run (scheduler.py:1);Scheduler.event_loop_overlap (scheduler.py:40);"
    "Scheduler.run_batch (scheduler.py:50);sample (sampler.py:7) 3\n",
    f"{MAIN};{SCHED};run (scheduler.py:1);Scheduler.event_loop_overlap (scheduler.py:41);"
    "Scheduler.process_result (out.py:7);Req.check_finished (batch.py:2) 6\n",
    f"{MAIN};{SCHED};run (scheduler.py:1);Scheduler.event_loop_overlap (scheduler.py:42) 1\n",
    f"{MAIN};{SCHED};run (scheduler.py:1);Scheduler.__init__ (scheduler.py:9) 4\n",
    "garbage line without a count\n",
]


def test_frame_names_drop_directories_and_line_numbers():
    assert frame_name("Req.check_finished (sglang/srt/batch.py:123)") == "Req.check_finished (batch.py)"
    assert frame_name("<module> (<string>:1)") == "<module> (<string>)"


def test_innermost_process_and_function_filter():
    s = summarize(LINES, process="spawn_main", under="event_loop_overlap")
    assert s["samples_total"] == 19
    assert s["samples_kept"] == 10  # the scheduler's loop only: not main's 5, not __init__'s 4
    assert dict((name, n) for name, n, _ in s["under_children"]) == {
        "Scheduler.process_result (out.py)": 6,
        "Scheduler.run_batch (scheduler.py)": 3,
        "event_loop_overlap (itself)": 1,
    }
    exclusive = {name: (n, share) for name, n, share in s["exclusive"]}
    assert exclusive["Req.check_finished (batch.py)"] == (6, 0.6)
    assert exclusive["sample (sampler.py)"] == (3, 0.3)
    inclusive = {name: n for name, n, _ in s["inclusive"]}
    assert inclusive["Scheduler.event_loop_overlap (scheduler.py)"] == 10  # three lines, one function
    assert dict(s["processes"]) == {SCHED: 14, MAIN: 5}


def test_no_filter_keeps_every_process():
    s = summarize(LINES)
    assert s["samples_kept"] == 19
    assert {name for name, _, _ in s["exclusive"]} >= {"wait (bench.py)", "Scheduler.__init__ (scheduler.py)"}


def test_command_line_reads_gzip(tmp_path: Path):
    raw = tmp_path / "spy.txt.gz"
    with gzip.open(raw, "wt") as f:
        f.writelines(LINES)
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.pyspy_summary", str(raw), "--under", "run_batch"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)["samples_kept"] == 3
    missing = subprocess.run(
        [sys.executable, "-m", "benchmarks.pyspy_summary", str(tmp_path / "nope.txt")],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "no file" in missing.stderr and "Traceback" not in missing.stderr
