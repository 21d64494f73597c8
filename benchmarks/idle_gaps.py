"""Why the GPU idles: each gap between kernels of a torch-profiler chrome trace recorded with CPU
and CUDA activity, put down to what the host was doing when the GPU ran dry.

    python -m benchmarks.idle_gaps TRACE [--min-gap-us 5] [--top 15]   # prints one JSON object

A gap ends with a kernel; its launch (the CUDA runtime call of the same `correlation`) says why it
came late:
- `host sync`: a synchronising runtime call (stream / event / device synchronize, a blocking
  memcpy) returned inside the gap, before the launch. The host waited for the GPU to drain, then
  needed the gap's time to queue work again. Source: the innermost host op around the sync (e.g.
  `aten::_local_scalar_dense` for `.item()`, `aten::copy_` for `.cpu()`), with its outer op.
- `host launch`: the launch came after the gap began, with no sync in between. The host was busy
  (Python, op dispatch, launches of earlier kernels) and the GPU had nothing queued. Source: the
  innermost host op around the launch, with its outer op.
- `dependency`: the launch came before the gap began, yet the kernel started late. It waited on
  another stream (an event) or on a copy engine. Source: the kernel that ended the gap.
- `unlinked`: no runtime call carries the kernel's correlation (a CUDA graph replay's inner
  kernels, or a trace without CPU activity).

With Python stacks in the trace (`with_stack=True`), `host_code` also names the code the host ran
while the GPU waited: for each host sync or host launch gap, the innermost Python frame of the
project's packages (`CODE_PACKAGES`) running on the launching thread halfway between the moment the
host could have queued work (the gap's start, or the sync's return) and the launch.

A host profiled with CPU activity runs slower than without, so the gaps are longer than in an
unprofiled call; their causes and relative sizes are what this is for.
"""

from __future__ import annotations

import argparse
import bisect
import json
from collections import defaultdict
from pathlib import Path

from benchmarks.trace_summary import load_events

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
HOST_OP_CATEGORIES = ("cpu_op", "user_annotation")
# Runtime calls that return only once the GPU has done (part of) its queued work
SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaDeviceSynchronize",
    "cudaMemcpy",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuCtxSynchronize",
    "cuMemcpyDtoH_v2",
)
CAUSES = ("host sync", "host launch", "dependency", "unlinked")
# the packages whose Python frames `host_code` names (the profiler's frame names hold their paths)
CODE_PACKAGES = ("rlinf/", "benchmarks/", "megatron/", "transformer_engine/")
# the host's and the GPU's clocks in a trace agree to a few microseconds: a sync that returns this
# much before the GPU ran dry still counts as waiting for it
CLOCK_SKEW_US = 10.0


def code_frame(name: str) -> str | None:
    """A Python frame's name from the package path on ('.../site/megatron/core/x.py(12): f' ->
    'megatron/core/x.py(12): f'), or None outside CODE_PACKAGES."""
    starts = [i for i in (name.find(p) for p in CODE_PACKAGES) if i >= 0 and (i == 0 or name[i - 1] == "/")]
    return name[min(starts) :] if starts else None


class HostOps:
    """The host ops of each thread (or the Python frames, with `frames`), to name the innermost one
    running at a moment."""

    def __init__(self, events: list[dict], frames: bool = False):
        by_thread: dict[object, list[tuple[float, float, str]]] = defaultdict(list)
        for e in events:
            if e.get("ph") != "X":
                continue
            if frames:
                name = code_frame(str(e["name"])) if e.get("cat") == "python_function" else None
            else:
                name = str(e["name"]) if e.get("cat") in HOST_OP_CATEGORIES else None
            if name is not None:
                start = float(e["ts"])
                by_thread[e.get("tid")].append((start, start + float(e.get("dur", 0.0)), name))
        self.ops = {tid: sorted(ops) for tid, ops in by_thread.items()}
        self.starts = {tid: [op[0] for op in ops] for tid, ops in self.ops.items()}

    def around(self, tid: object, moment: float, depth: int = 2) -> str:
        """'inner < outer': the `depth` innermost ops of `tid` running at `moment` ('-' when none).
        Ops nest, so the innermost running op is the running op that started last."""
        ops, starts = self.ops.get(tid, []), self.starts.get(tid, [])
        names: list[str] = []
        i = bisect.bisect_right(starts, moment) - 1
        while i >= 0 and len(names) < depth:
            start, stop, name = ops[i]
            if start <= moment <= stop and (not names or name != names[-1]):
                names.append(name)
            i -= 1
        return " < ".join(names) if names else "-"


def idle_gaps(events: list[dict], min_gap_us: float = 5.0, top: int = 15) -> dict:
    """The idle time between kernels (gaps of at least `min_gap_us`), by cause and by host source."""
    kernels = sorted(
        (
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e)
            for e in events
            if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES
        ),
        key=lambda k: k[:2],  # kernels on two streams can share their times; their events do not sort
    )
    if not kernels:
        raise ValueError("no GPU kernel events in the trace (profiled without the GPU activity?)")
    launches: dict[object, dict] = {}
    syncs: list[tuple[float, dict]] = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in RUNTIME_CATEGORIES:
            continue
        correlation = (e.get("args") or {}).get("correlation")
        if correlation is not None:
            launches.setdefault(correlation, e)
        if e.get("name") in SYNC_CALLS:
            syncs.append((float(e["ts"]) + float(e.get("dur", 0.0)), e))
    syncs.sort(key=lambda s: s[0])
    sync_ends = [s[0] for s in syncs]
    host, frames = HostOps(events), HostOps(events, frames=True)
    by_cause = {cause: [0.0, 0] for cause in CAUSES}
    by_source: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    by_code: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    busy_until = kernels[0][1]
    for start, stop, kernel in kernels[1:]:
        gap = start - busy_until
        if gap >= min_gap_us:
            cause, source, busy = _cause(busy_until, kernel, launches, syncs, sync_ends, host)
            entries = [by_cause[cause], by_source[(cause, source)]]
            if busy is not None and frames.ops:
                tid, (since, launched_at) = busy
                entries.append(by_code[frames.around(tid, (since + launched_at) / 2, depth=1)])
            for entry in entries:
                entry[0] += gap
                entry[1] += 1
        busy_until = max(busy_until, stop)
    span = busy_until - kernels[0][0]
    idle = sum(v[0] for v in by_cause.values())
    ranked = sorted(by_source.items(), key=lambda kv: -kv[1][0])
    return {
        "span_ms": round(span / 1e3, 3),
        "idle_ms": round(idle / 1e3, 3),
        "gaps": sum(v[1] for v in by_cause.values()),
        "min_gap_us": min_gap_us,
        "by_cause": {c: {"ms": round(v[0] / 1e3, 3), "gaps": v[1]} for c, v in by_cause.items()},
        "top_sources": [
            {"cause": cause, "source": source, "ms": round(ms / 1e3, 3), "gaps": n}
            for (cause, source), (ms, n) in ranked[:top]
        ],
        **(
            {
                "host_code": [
                    {"code": code, "ms": round(ms / 1e3, 3), "gaps": n}
                    for code, (ms, n) in sorted(by_code.items(), key=lambda kv: -kv[1][0])[:top]
                ]
            }
            if frames.ops
            else {}
        ),
    }


def _cause(
    gap_start: float,
    kernel: dict,
    launches: dict[object, dict],
    syncs: list[tuple[float, dict]],
    sync_ends: list[float],
    host: HostOps,
) -> tuple[str, str, tuple[object, tuple[float, float]] | None]:
    """(cause, source, where the host was busy instead: its thread and (from, to), for host
    causes)."""
    launch = launches.get((kernel.get("args") or {}).get("correlation"))
    if launch is None:
        return "unlinked", str(kernel.get("name", "?")), None
    launched_at = float(launch["ts"])
    if launched_at < gap_start:
        return "dependency", str(kernel.get("name", "?")), None
    tid = launch.get("tid")
    # the latest sync of the launching thread that returned inside the gap, before the launch
    i = bisect.bisect_right(sync_ends, launched_at) - 1
    while i >= 0 and syncs[i][0] >= gap_start - CLOCK_SKEW_US:
        end, sync = syncs[i]
        if sync.get("tid") == tid:
            source = f"{sync['name']} in {host.around(tid, end - 1e-3)}"
            return "host sync", source, (tid, (max(end, gap_start), launched_at))
        i -= 1
    return "host launch", host.around(tid, launched_at), (tid, (gap_start, launched_at))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--min-gap-us", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    try:
        print(
            json.dumps(
                {"trace": str(args.trace), **idle_gaps(load_events(args.trace), args.min_gap_us, args.top)}
            )
        )
    except (OSError, ValueError, KeyError) as err:
        raise SystemExit(f"{args.trace}: cannot attribute the idle gaps: {err}") from None


if __name__ == "__main__":
    main()
