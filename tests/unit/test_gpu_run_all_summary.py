"""tests/gpu/run_all_summary.py: what run_all.sh reports is what pytest and the benchmarks said."""

from __future__ import annotations

import importlib.util
import json
import re
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


def test_the_slowest_test_phases_come_from_pytests_durations_lines():
    log = "\n".join(
        [
            "============================= slowest 3 durations ==============================",
            "96.10s call     tests/gpu/test_x.py::test_a[bf16]",
            "0.79s setup    tests/gpu/test_x.py::test_b",
            "130.5s call     tests/gpu/test_y.py::test_c",
            "12.0s call in a sentence that is not a durations line",
        ]
    )
    slowest = summary.suite_record("actor", 0, 240.0, log, [])["slowest"]
    assert [(d["seconds"], d["phase"], d["test"]) for d in slowest] == [
        (130.5, "call", "tests/gpu/test_y.py::test_c"),
        (96.1, "call", "tests/gpu/test_x.py::test_a[bf16]"),
        (0.79, "setup", "tests/gpu/test_x.py::test_b"),
    ]


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


def _record(suite: str, code: str, **counts) -> dict:
    return {"suite": suite, "rc": 0, "seconds": 1.0, "passed": 1, "failed": 0, "skipped": 0, "errors": 0,
            "code": code, "figures": [], **counts}  # fmt: skip


def test_the_code_fingerprint_follows_the_code_the_gpu_runs_and_ignores_the_rest(tmp_path):
    for name, text in [
        ("rlinf/a.py", "x = 1\n"),
        ("tests/gpu/run.sh", "echo\n"),
        ("tests/unit/test_a.py", "a = 1\n"),
    ]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    first = summary.code_fingerprint(tmp_path)
    (tmp_path / "tests/unit/test_a.py").write_text("a = 2\n")
    (tmp_path / "rlinf/__pycache__").mkdir()
    (tmp_path / "rlinf/__pycache__/a.cpython-312.pyc").write_bytes(b"\0")
    assert summary.code_fingerprint(tmp_path) == first
    (tmp_path / "rlinf/a.py").write_text("x = 2\n")
    assert summary.code_fingerprint(tmp_path) != first


def test_a_checkout_and_the_copy_a_gpu_machine_gets_have_one_fingerprint(tmp_path):
    root = SCRIPT.parents[2]
    copy = tmp_path / "copy"
    for path in summary.code_files(root):  # the working tree's files, without .git
        target = copy / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    assert summary.code_fingerprint(copy) == summary.code_fingerprint(root)


def test_run_all_lists_the_suites_the_summary_expects():
    script = (SCRIPT.parent / "run_all.sh").read_text()
    code = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert tuple(name for line in code for name in re.findall(r'\bsuite ([\w-]+) "', line)) == summary.SUITES
    listed = {
        name: re.search(rf'^{name}="([^"]+)"', script, re.M).group(1).split()
        for name in ("SUITES", "BY_LENGTH")
    }
    assert tuple(listed["SUITES"]) == summary.SUITES and sorted(listed["BY_LENGTH"]) == sorted(summary.SUITES)


def test_parts_from_several_machines_merge_into_one_green_run_only_on_one_code(tmp_path):
    first = {
        "suites": [_record(name, "c1") for name in summary.SUITES[:4]] + [_record("sync", "c1", failed=1)]
    }
    second = {"suites": [_record(name, "c1") for name in summary.SUITES[4:]]}
    whole = summary.merged([first, second], "c1")
    assert [s["suite"] for s in whole["suites"]] == list(summary.SUITES)  # the rerun sync wins, in order
    assert summary.green(whole) and whole["totals"]["passed"] == len(summary.SUITES)
    assert summary.merged([first], "c1")["missing"] == [n for n in summary.SUITES[4:] if n != "sync"]
    assert summary.merged([second, first], "c1")["not_green"] == ["sync"]
    assert not summary.green(summary.merged([first, second], "c2"))
    second["suites"][-1]["code"] = "c2"
    assert summary.merged([first, second], "c1")["other_code"] == [summary.SUITES[-1]]
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(
        json.dumps({"suites": [_record(n, summary.code_fingerprint()) for n in summary.SUITES]})
    )
    out = tmp_path / "all.json"
    assert summary.main(["merge", str(out), str(tmp_path / "a.json")]) == 1
    assert summary.main(["merge", str(out), str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert json.loads(out.read_text())["code"] == summary.code_fingerprint()


def test_one_machines_summary_of_parts_that_ran_different_code_is_not_green(tmp_path):
    lines = tmp_path / "summary.jsonl"
    lines.write_text(json.dumps(_record("engine", "c1")) + "\n" + json.dumps(_record("loop", "c2")) + "\n")
    out = tmp_path / "out.json"
    assert summary.main(["show", str(lines), str(out)]) == 1
    assert json.loads(out.read_text())["not_green"] == ["engine", "loop"]


def test_status_says_whether_the_recorded_green_run_covers_this_code_and_what_changed(tmp_path):
    root = tmp_path / "repo"
    for name in ("rlinf/a.py", "rlinf/b.py", "tests/gpu/run.sh"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    recorded = tmp_path / "gpu_run_all.json"
    assert summary.status_line(recorded, root).startswith("GPU checks: no run_all summary")
    digests = summary.code_digests(root)
    code = summary.code_fingerprint(root)
    run = summary.merged([{"suites": [_record(n, code) for n in summary.SUITES]}], code, digests)
    recorded.write_text(json.dumps(run))
    assert summary.status_line(recorded, root).startswith(f"GPU checks: green on this code ({code}")
    (root / "rlinf/a.py").write_text("changed")
    (root / "rlinf/c.py").write_text("new")
    (root / "rlinf/b.py").unlink()
    line = summary.status_line(recorded, root)
    assert line.endswith("since then changed: rlinf/a.py; added: rlinf/c.py; removed: rlinf/b.py"), line
    run["suites"][0]["failed"] = 1
    recorded.write_text(json.dumps(summary.merged([run], code, digests)))
    assert "is not green" in summary.status_line(recorded, root)


def test_too_few_arguments_print_the_usage_and_write_nothing(tmp_path, capsys):
    part = tmp_path / "part.json"
    part.write_text('{"suites": []}\n')
    # merge-some's first argument is the suites: without it the part would be taken as the output
    assert summary.main(["merge-some", str(tmp_path / "out.json"), str(part)]) == 2
    assert summary.main([]) == 2
    assert summary.main(["show", str(part)]) == 2
    assert part.read_text() == '{"suites": []}\n' and not (tmp_path / "out.json").exists()
    assert 'merge-some "SUITE..." OUT_JSON PART_JSON...' in capsys.readouterr().err
