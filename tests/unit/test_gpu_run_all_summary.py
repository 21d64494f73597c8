"""tests/gpu/run_all_summary.py: what run_all.sh reports is what pytest and the benchmarks said."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "gpu" / "run_all_summary.py"
spec = importlib.util.spec_from_file_location("run_all_summary", SCRIPT)
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)


def test_pytest_closing_lines_are_added_up():
    log = "\n".join(
        [
            "..F.s",
            "FAILED tests/gpu/test_x.py::test_a - assert 1 == 2",
            "1 failed, 3 passed, 1 skipped in 12.50s",
            "== second pytest ==",
            "===== 2 passed, 4 deselected, 1 error in 3.1s (0:00:03) =====",
        ]
    )
    assert summary.pytest_counts(log) == {"passed": 5, "failed": 1, "skipped": 1, "errors": 1}
    assert summary.pytest_counts("no tests here\n3 passed engines") is None


def test_a_benchmark_counts_its_exit_status_and_a_killed_pytest_is_an_error():
    assert summary.suite_record("step", 0, 1.0, "{}", [])["passed"] == 1
    assert summary.suite_record("step", 124, 1.0, "{}", [])["failed"] == 1
    killed = summary.suite_record("actor", 124, 9.0, "3 passed in 1.0s", [])
    assert (killed["passed"], killed["errors"]) == (3, 1)


def test_show_is_green_only_without_failures_skips_or_errors(tmp_path):
    lines = tmp_path / "summary.jsonl"
    figures = tmp_path / "figures.jsonl"
    figures.write_text('{"check": "old"}\n{"check": "new", "x": 1}\nnot json\n')
    log = tmp_path / "suite.log"
    log.write_text("4 passed in 2.0s\n")
    assert summary.main(["add", str(lines), "engine", "0", "7", str(log), str(figures), "1"]) == 0
    out = tmp_path / "out.json"
    assert summary.main(["show", str(lines), str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["suites"][0]["figures"] == [{"check": "new", "x": 1}]
    assert written["totals"]["passed"] == 4 and written["not_green"] == []
    log.write_text("4 passed, 1 skipped in 2.0s\n")
    summary.main(["add", str(lines), "loop", "0", "3", str(log), str(figures), "3"])
    assert summary.main(["show", str(lines), str(out)]) == 1
    assert json.loads(out.read_text())["not_green"] == ["loop"]
