"""Where a Python process spends its host time, from py-spy's raw (collapsed-stack) output.

py-spy (`py-spy record --format raw [--subprocesses] -o FILE -- python ...`) writes one line per
distinct stack: `frame;frame;...;frame COUNT`, outermost first, each frame `function (file:line)`,
and with --subprocesses a frame `process PID:"command line"` before each process's own frames
(a child's after its parent's). This keeps the samples of the
processes whose command line contains --process and whose stack passes through a frame naming
--under (e.g. SGLang's scheduler loop), and prints JSON: samples kept, and the functions with the
most samples inclusive (on the stack) and exclusive (the innermost frame), each as a share of the
kept samples. Lines are read as a stream, so a file of hundreds of MB is fine.

    python -m benchmarks.pyspy_summary spy.txt --process sglang::scheduler --under event_loop_overlap
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `func (file.py)`: one entry per function, not per line."""
    match = FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    return f"{match['func']} ({Path(match['file']).name})"


def _is_function(name: str, wanted: str) -> bool:
    """Whether frame `name` (`func (file.py)`) is function `wanted`, bare or as `Class.wanted`."""
    func = name.rsplit(" (", 1)[0]
    return func == wanted or func.endswith(f".{wanted}")


def summarize(lines, process: str | None = None, under: str | None = None, top: int = 25) -> dict:
    inclusive: Counter[str] = Counter()
    exclusive: Counter[str] = Counter()
    children: Counter[str] = Counter()  # the frame right below `under`: what the loop spends on
    processes: Counter[str] = Counter()
    kept = total = 0
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        # With --subprocesses a child's stack follows its parent's: the innermost process frame
        # names the process the sample is from.
        starts = [i for i, f in enumerate(frames) if f.startswith("process ")]
        if starts:
            processes[frames[starts[-1]][:120]] += count
            if process is not None and process not in frames[starts[-1]]:
                continue
            frames = frames[starts[-1] + 1 :]
        elif process is not None:
            continue
        names = [frame_name(f) for f in frames if not f.startswith("thread ")]
        if under is not None:
            hits = [i for i, name in enumerate(names) if _is_function(name, under)]
            if not hits:
                continue
            below = names[hits[0] + 1 : hits[0] + 2]
            children[below[0] if below else f"{under} (itself)"] += count
        if not names:
            continue
        kept += count
        for name in set(names):
            inclusive[name] += count
        exclusive[names[-1]] += count

    def shares(counter: Counter[str]) -> list[list]:
        return [[name, n, round(n / kept, 4)] for name, n in counter.most_common(top)] if kept else []

    out = {"samples_total": total, "samples_kept": kept, "process": process, "under": under}
    out["processes"] = processes.most_common(top)
    out["inclusive"] = shares(inclusive)
    out["exclusive"] = shares(exclusive)
    if under is not None:
        out["under_children"] = shares(children)
    return out


def open_text(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else path.open()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, help="py-spy --format raw output (.gz read as gzip)")
    parser.add_argument("--process", default=None, help="keep processes whose command line contains this")
    parser.add_argument("--under", default=None, help="keep stacks through a frame of this function")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    if not args.raw.is_file():
        raise SystemExit(f"pyspy_summary: no file {args.raw}")
    with open_text(args.raw) as lines:
        print(json.dumps(summarize(lines, args.process, args.under, args.top), indent=1))


if __name__ == "__main__":
    main()
