"""Where a profiled stretch of GPU time goes: a torch-profiler chrome trace (.json or .json.gz, e.g.
SGLang's `start_profile(profile_by_stage=True)` DECODE trace) summarised as GPU busy time, idle
gaps and the kernels that take the most time, per scheduler step when the step count is given.

    python -m benchmarks.trace_summary TRACE [--steps N] [--top 12]   # prints one JSON object

Busy time is the union of kernel intervals (overlapping kernels on several streams count once);
idle is the rest of the span from the first kernel's start to the last kernel's end. A decode loop
whose idle share is large is bound by the host (scheduling, Python), not by the GPU's kernels.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def kernel_intervals(events: list[dict]) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of every GPU kernel (and memcpy/memset) event."""
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            start = float(e["ts"])
            out.append((start, start + float(e.get("dur", 0.0)), str(e.get("name", "?"))))
    return out


def busy_time(intervals: list[tuple[float, float, str]]) -> float:
    """Length of the union of the intervals (µs)."""
    total, end = 0.0, float("-inf")
    for start, stop, _ in sorted(intervals):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def short_name(name: str, width: int = 90) -> str:
    """A kernel's name without its return type and argument list (template arguments kept)."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "").split("(")[0]
    return name if len(name) <= width else name[: width - 3] + "..."


def summarize(events: list[dict], steps: int | None = None, top: int = 12) -> dict:
    intervals = kernel_intervals(events)
    if not intervals:
        raise ValueError("no GPU kernel events in the trace (profiled without the GPU activity?)")
    span = max(i[1] for i in intervals) - min(i[0] for i in intervals)
    busy = busy_time(intervals)
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for start, stop, name in intervals:
        entry = per_kernel[short_name(name)]
        entry[0] += stop - start
        entry[1] += 1
    scale = 1e-3 / (steps or 1)  # µs -> ms, per step when known
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])
    kernel_total = sum(v[0] for v in per_kernel.values())
    summary = {
        "steps": steps,
        "unit": "ms per step" if steps else "ms",
        "span": round(span * scale, 4),
        "gpu_busy": round(busy * scale, 4),
        "gpu_idle": round((span - busy) * scale, 4),
        "gpu_busy_share": round(busy / span, 4) if span else 0.0,
        "kernels_launched": len(intervals),
        "top_kernels": [
            {
                "name": name,
                "time": round(total * scale, 4),
                "share_of_kernel_time": round(total / kernel_total, 4),
                "calls": count,
            }
            for name, (total, count) in ranked[:top]
        ],
    }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--steps", type=int, default=None, help="scheduler steps the trace covers")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    try:
        print(
            json.dumps({"trace": str(args.trace), **summarize(load_events(args.trace), args.steps, args.top)})
        )
    except (OSError, ValueError, KeyError) as err:
        raise SystemExit(f"{args.trace}: cannot summarise the trace: {err}") from None


if __name__ == "__main__":
    main()
