"""One suite's line in tests/gpu/run_all.sh's JSON summary, and the summary itself.

    python3 tests/gpu/run_all_summary.py add SUMMARY SUITE RC SECONDS LOG FIGURES FIRST_FIGURE_LINE
    python3 tests/gpu/run_all_summary.py show SUMMARY OUT_JSON

`add` reads pytest's closing lines ("3 passed, 1 failed, 2 skipped in ...") from the suite's log
(a suite without pytest, a benchmark, counts its exit status as one check) and keeps the figure
records the suite wrote (the lines of FIGURES from FIRST_FIGURE_LINE on). `show` writes the whole
summary as one JSON file and exits 1 when any suite failed, skipped or did not run to its end.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")
CLOSING = re.compile(r"^=*\s*(\d+ (passed|failed|skipped|errors?|deselected).*) in [\d.]+s")


def pytest_counts(log: str) -> dict[str, int] | None:
    """The counts of every pytest closing line in `log` added up (a suite may run pytest more than
    once), or None when no pytest summary is there."""
    closing = [m.group(1) for line in log.splitlines() if (m := CLOSING.match(line.strip()))]
    if not closing:
        return None
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for number, kind in COUNT.findall(" ".join(closing)):
        key = "errors" if kind.startswith("error") else kind
        if key in counts:
            counts[key] += int(number)
    return counts


def suite_record(suite: str, rc: int, seconds: float, log: str, figures: list[dict]) -> dict:
    counts = pytest_counts(log)
    if counts is None:  # a benchmark or a script: one check, its exit status
        counts = {"passed": int(rc == 0), "failed": int(rc != 0), "skipped": 0, "errors": 0}
    elif rc != 0 and counts["failed"] + counts["errors"] == 0:
        counts["errors"] += 1  # pytest (or its timeout) ended badly without a failed test
    return {"suite": suite, "rc": rc, "seconds": round(seconds, 1), **counts, "figures": figures}


def read_figures(path: Path, first_line: int) -> list[dict]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines()[first_line:]:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def main(argv: list[str]) -> int:
    action, summary = argv[0], Path(argv[1])
    if action == "add":
        suite, rc, seconds, log, figures, first = argv[2:8]
        text = Path(log).read_text(errors="replace") if Path(log).is_file() else ""
        record = suite_record(suite, int(rc), float(seconds), text, read_figures(Path(figures), int(first)))
        with summary.open("a") as f:
            f.write(json.dumps(record) + "\n")
        short = {k: v for k, v in record.items() if k != "figures"}
        print(f"run_all: {json.dumps(short)}", flush=True)
        return 0
    suites = [json.loads(line) for line in summary.read_text().splitlines()] if summary.is_file() else []
    bad = [s["suite"] for s in suites if s["failed"] or s["errors"] or s["skipped"] or s["rc"]]
    totals = {k: sum(s[k] for s in suites) for k in ("passed", "failed", "skipped", "errors", "seconds")}
    Path(argv[2]).write_text(json.dumps({"suites": suites, "totals": totals, "not_green": bad}, indent=1))
    print(f"run_all: totals {json.dumps(totals)}; not green: {bad or 'none'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
