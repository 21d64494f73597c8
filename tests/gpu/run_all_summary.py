"""One suite's line in tests/gpu/run_all.sh's JSON summary, and the summary itself.

    python3 tests/gpu/run_all_summary.py add SUMMARY SUITE RC SECONDS LOG FIGURES FIRST_FIGURE_LINE
    python3 tests/gpu/run_all_summary.py show SUMMARY OUT_JSON
    python3 tests/gpu/run_all_summary.py merge OUT_JSON PART_JSON...
    python3 tests/gpu/run_all_summary.py merge-some "SUITE..." OUT_JSON PART_JSON...
    python3 tests/gpu/run_all_summary.py code
    python3 tests/gpu/run_all_summary.py status [SUMMARY_JSON]

`add` reads pytest's closing lines ("3 passed, 1 failed, 2 skipped in ...") from the suite's log
(a suite without pytest, a benchmark, counts its exit status as one check), keeps the figure
records the suite wrote (the lines of FIGURES from FIRST_FIGURE_LINE on) and stamps the record with
the fingerprint of the code the GPU runs (`code`). `show` writes the whole summary as one JSON file
and exits 1 when any suite failed, skipped, did not run to its end, or ran other code than the rest.

`merge` joins the summaries of parts run on several machines (one per device session, say) into
one: the last record of each suite wins, and it is green only when every suite of run_all.sh is
there, green, and ran the code of this checkout, so the parts add up to one commit's run even when
no single machine ran them all; `merge-some` writes the same, but its exit status judges only the
suites it names (run_all.sh side-by-side of some parts): each there, green, on this code. `code` prints this checkout's fingerprint;
`status` says whether a merged summary (default docs/data/gpu_run_all.json, the last green run
kept in the repository) is green on this checkout's code, and which files the GPU runs changed since.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")
CLOSING = re.compile(r"^=*\s*(\d+ (passed|failed|skipped|errors?|deselected).*) in [\d.]+s")
DURATION = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S+::\S+)$")
ROOT = Path(__file__).resolve().parents[2]
RECORDED = "docs/data/gpu_run_all.json"  # the last green run_all, merged
# What the GPU runs: a change elsewhere (docs, the CPU tests) leaves earlier GPU results standing.
CODE = ("rlinf", "benchmarks", "examples", "tests/gpu", "tests/fixtures", "pyproject.toml")
CODE_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".json", ".toml", ".txt", ".cfg"}
# Every suite tests/gpu/run_all.sh runs, in its order
SUITES = (
    "engine",
    "megatron-actor",
    "optim",
    "megatron-grpo",
    "pack",
    "grouped-experts",
    "cuda-graphs",
    "sync",
    "hf-export",
    "loop",
    "step",
    "routing-replay-step",
)


def code_files(root: Path) -> list[Path]:
    """The files of CODE as a GPU machine's copy of the working tree has them: in a git checkout the
    tracked and untracked-but-not-ignored ones, elsewhere (that copy) all of them."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "--", *CODE],
            cwd=root, capture_output=True, text=True, check=True,
        ).stdout.split("\n")  # fmt: skip
        files = [root / name for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for entry in CODE:
            path = root / entry
            files += [path] if path.is_file() else list(path.rglob("*"))
    return sorted(
        f for f in files if f.is_file() and f.suffix in CODE_SUFFIXES and "__pycache__" not in f.parts
    )


def code_digests(root: Path = ROOT) -> dict[str, str]:
    """Each file of the code the GPU runs under `root`: its path and sha256 (first 16 hex digits)."""
    return {
        path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        for path in code_files(root)
    }


def code_fingerprint(root: Path = ROOT, digests: dict[str, str] | None = None) -> str:
    """One digest of `code_digests`: equal on a git checkout and on the copy of its working tree a
    GPU machine gets."""
    listing = json.dumps(sorted((digests or code_digests(root)).items()))
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


def changed_files(recorded: dict[str, str], now: dict[str, str]) -> dict[str, list[str]]:
    return {
        "changed": sorted(k for k in recorded.keys() & now.keys() if recorded[k] != now[k]),
        "added": sorted(now.keys() - recorded.keys()),
        "removed": sorted(recorded.keys() - now.keys()),
    }


def status_line(summary_path: Path, root: Path = ROOT) -> str:
    """Whether the recorded run_all summary is green on the code of `root`, and if not, why."""
    if not summary_path.is_file():
        return f"GPU checks: no run_all summary at {summary_path}"
    summary = json.loads(summary_path.read_text())
    if not green(summary):
        return f"GPU checks: the run_all summary at {summary_path} is not green"
    now = code_digests(root)
    if summary["code"] == code_fingerprint(root, now):
        return f"GPU checks: green on this code ({summary['code']}, {summary_path})"
    diff = changed_files(summary.get("files", {}), now)
    names = [f"{kind}: {', '.join(files)}" for kind, files in diff.items() if files]
    return f"GPU checks: green on code {summary['code']}, not on this code; since then {'; '.join(names)}"


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


def slowest_phases(log: str, top: int = 8) -> list[dict]:
    """pytest's --durations lines ("12.50s call  tests/gpu/test_x.py::test_a"), slowest first."""
    found = [
        {"seconds": float(m.group(1)), "phase": m.group(2), "test": m.group(3)}
        for line in log.splitlines()
        if (m := DURATION.match(line.strip()))
    ]
    return sorted(found, key=lambda d: -d["seconds"])[:top]


def suite_record(suite: str, rc: int, seconds: float, log: str, figures: list[dict]) -> dict:
    counts = pytest_counts(log)
    if counts is None:  # a benchmark or a script: one check, its exit status
        counts = {"passed": int(rc == 0), "failed": int(rc != 0), "skipped": 0, "errors": 0}
    elif rc != 0 and counts["failed"] + counts["errors"] == 0:
        counts["errors"] += 1  # pytest (or its timeout) ended badly without a failed test
    return {
        "suite": suite,
        "rc": rc,
        "seconds": round(seconds, 1),
        **counts,
        "slowest": slowest_phases(log),
        "code": code_fingerprint(),
        "figures": figures,
    }


def not_green(suites: list[dict]) -> list[str]:
    return [s["suite"] for s in suites if s["failed"] or s["errors"] or s["skipped"] or s["rc"]]


def totals(suites: list[dict]) -> dict:
    return {
        k: round(sum(s[k] for s in suites), 1) for k in ("passed", "failed", "skipped", "errors", "seconds")
    }


def merged(parts: list[dict], code: str, files: dict[str, str] | None = None) -> dict:
    """One summary from several machines' summaries (later parts win per suite), judged against the
    code fingerprint `code` (whose per-file digests `files` it keeps) and run_all.sh's whole list of
    suites."""
    latest: dict[str, dict] = {}
    for part in parts:
        for record in part["suites"]:
            latest[record["suite"]] = record
    suites = [latest[name] for name in SUITES if name in latest]
    suites += [r for name, r in latest.items() if name not in SUITES]
    return {
        "code": code,
        "files": files or {},
        "suites": suites,
        "totals": totals(suites),
        "not_green": not_green(suites),
        "missing": [name for name in SUITES if name not in latest],
        "other_code": [s["suite"] for s in suites if s.get("code") != code],
    }


def green(summary: dict, only: Collection[str] | None = None) -> bool:
    """Every suite there, green, on the summary's code; `only`: judge these suites alone."""
    return not any(
        name
        for key in ("not_green", "missing", "other_code")
        for name in summary.get(key, [])
        if only is None or name in only
    )


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


ARGUMENTS = {"add": 8, "show": 3, "merge": 3, "merge-some": 4, "code": 1, "status": 1}  # the fewest


def main(argv: list[str]) -> int:
    if not argv or len(argv) < ARGUMENTS.get(argv[0], 99):
        usage = [line.strip() for line in __doc__.splitlines() if "run_all_summary.py" in line]
        print("usage:\n  " + "\n  ".join(usage), file=sys.stderr)
        return 2
    action = argv[0]
    if action == "code":
        print(code_fingerprint())
        return 0
    summary = Path(argv[1]) if len(argv) > 1 else ROOT / RECORDED
    if action == "add":
        suite, rc, seconds, log, figures, first = argv[2:8]
        text = Path(log).read_text(errors="replace") if Path(log).is_file() else ""
        record = suite_record(suite, int(rc), float(seconds), text, read_figures(Path(figures), int(first)))
        with summary.open("a") as f:
            f.write(json.dumps(record) + "\n")
        short = {k: v for k, v in record.items() if k != "figures"}
        print(f"run_all: {json.dumps(short)}", flush=True)
        return 0
    if action == "status":  # informational: never fails (a CPU machine cannot rerun the GPU checks)
        print(status_line(summary))
        return 0
    if action in ("merge", "merge-some"):
        only = argv.pop(1).split() if action == "merge-some" else None
        summary = Path(argv[1])
        digests = code_digests()
        out = merged(
            [json.loads(Path(p).read_text()) for p in argv[2:]], code_fingerprint(digests=digests), digests
        )
        summary.write_text(json.dumps(out, indent=1) + "\n")
        print(
            f"run_all: totals {json.dumps(out['totals'])}; not green: {out['not_green'] or 'none'}; "
            f"missing: {out['missing'] or 'none'}; other code than this checkout's {out['code']}: "
            f"{out['other_code'] or 'none'}",
            flush=True,
        )
        return 0 if green(out, only) else 1  # merge-some: the named suites alone
    suites = [json.loads(line) for line in summary.read_text().splitlines()] if summary.is_file() else []
    codes = sorted({s.get("code") for s in suites})
    bad = not_green(suites)
    if len(codes) > 1:  # parts of one machine's summary ran different code: not one commit's run
        bad = [s["suite"] for s in suites]
    out = {
        "code": codes[0] if len(codes) == 1 else codes,
        "suites": suites,
        "totals": totals(suites),
        "not_green": bad,
    }
    Path(argv[2]).write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"run_all: code {out['code']}; totals {json.dumps(out['totals'])}; not green: {bad or 'none'}",
        flush=True,
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
