"""Tune SGLang's fused-MoE triton kernel for one expert shape on this GPU, and measure the gain.

SGLang reads a tuned config per (local experts E, expert width N, GPU, triton version); it ships
none for Moonlight's experts (E=64 on one GPU, E=8 per rank at EP=8; N=1408), so it falls back to
one generic config for every batch size. This script times the kernel pair (gate/up GEMM + SiLU +
down GEMM) for each batch size M under SGLang's generic config and each candidate (the distinct
configs of SGLang's own table for this GPU at the nearest width; about 1.6 s each per batch size,
mostly compilation), inside CUDA graphs as the engine runs decode, and writes the winners in
SGLang's file format under --out-dir (rlinf's shipped tables: rlinf/workers/rollout/moe_configs,
found by the rollout at engine start). Prints one JSON object: per M, the generic config against the
tuned one, both measured in this run, and the winning config.

    python -m benchmarks.tune_sglang_moe [--experts 64] [--width 1408] [--hidden 2048] [--topk 6]
        [--batches 1,16,64,256,1024,4096] [--out-dir rlinf/workers/rollout/moe_configs/configs]
    python -m benchmarks.tune_sglang_moe --write-from RESULT.json   # the table from a printed result
        # (the device tool brings back no file named with '=' or ',', so the table travels as JSON)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
import types
from pathlib import Path

import torch

from benchmarks._common import emit, environment
from rlinf.workers.rollout.moe_configs import config_file_name

BATCHES = "1,16,64,256,1024,4096"  # decode batches and prefill chunks; SGLang takes the nearest
CALLS_PER_GRAPH = 10
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def candidate_configs(sglang_config_root: Path, experts: int, width: int, device_name: str) -> list[dict]:
    """Distinct configs of SGLang's own bf16 table(s) for this GPU and `experts` experts at the width
    nearest to `width` (settings known to compile and run well here); failing that, of every
    Hopper table for `experts` experts."""

    def tables(gpu: str) -> list[str]:
        pattern = str(sglang_config_root / "triton_*" / f"E={experts},N=*,device_name={gpu}.json")
        return [p for p in glob.glob(pattern) if "dtype=" not in p]

    def table_width(path: str) -> int:
        return int(Path(path).name.split(",")[1].removeprefix("N="))

    paths = tables(device_name.replace(" ", "_"))
    if paths:
        nearest = min({table_width(p) for p in paths}, key=lambda w: abs(w - width))
        paths = [p for p in paths if table_width(p) == nearest]
    else:
        paths = tables("NVIDIA_H*")
    seen: dict[tuple, dict] = {}
    for path in paths:
        for cfg in json.loads(Path(path).read_text()).values():
            cfg = {k: int(cfg[k]) for k in KEYS if k in cfg}
            seen.setdefault(tuple(sorted(cfg.items())), cfg)
    return list(seen.values())


def table_path(out_dir: Path, triton_version: str, experts: int, width: int, device_name: str) -> Path:
    return (
        out_dir / f"triton_{triton_version.replace('.', '_')}" / config_file_name(experts, width, device_name)
    )


def write_table(out: Path, rows: list[dict]) -> None:
    """SGLang's table (batch size -> config) from this script's result rows."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({str(r["batch"]): r["config"] for r in rows}, indent=2) + "\n")


def write_table_from(result_file: Path, out_dir: Path) -> Path:
    """The table from this script's printed JSON result."""
    result = json.loads(result_file.read_text())
    shape = result["shape"]
    out = table_path(out_dir, result["triton"], shape["experts"], shape["width"], result["hardware"]["gpu"])
    write_table(out, result["rows"])
    return out


def time_call(fn, repeats: int = 5) -> float:
    """Seconds per call, from CUDA-graph replays of CALLS_PER_GRAPH calls (no host overhead, as in
    the engine's decode graphs)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # compile + warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / (repeats * CALLS_PER_GRAPH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=64, help="experts held by one GPU")
    parser.add_argument("--width", type=int, default=1408, help="expert intermediate size per GPU (N)")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--topk", type=int, default=6)
    parser.add_argument("--batches", default=BATCHES)
    parser.add_argument("--out-dir", type=Path, default=Path("rlinf/workers/rollout/moe_configs/configs"))
    parser.add_argument("--write-from", type=Path, default=None, metavar="RESULT.json")
    args = parser.parse_args()
    if args.write_from:
        print(write_table_from(args.write_from, args.out_dir))
        return

    if not torch.cuda.is_available():
        raise SystemExit("tune_sglang_moe.py: needs a CUDA GPU (it tunes for the GPU it runs on)")
    try:
        import sglang  # noqa: F401
    except ImportError as err:
        raise SystemExit(f"tune_sglang_moe.py: needs sglang 0.5.12 ({err}); see docs/sglang.md") from None
    import triton
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig, triton_utils
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import get_default_config
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    # The two server settings the kernel path reads; the defaults an engine would have.
    set_global_server_args_for_scheduler(
        types.SimpleNamespace(enable_fused_moe_sum_all_reduce=False, enable_deterministic_inference=False)
    )
    os.environ.pop("SGLANG_MOE_CONFIG_DIR", None)  # "default" must mean SGLang's own lookup
    root = Path(triton_utils.__file__).parent / "configs"
    E, N, K = args.experts, args.width, args.hidden
    device_name = torch.cuda.get_device_name()
    candidates = candidate_configs(root, E, N, device_name) or candidate_configs(root, 64, N, device_name)
    gen = torch.Generator(device="cuda").manual_seed(0)
    w1 = torch.randn(E, 2 * N, K, device="cuda", dtype=torch.bfloat16, generator=gen) / K**0.5
    w2 = torch.randn(E, K, N, device="cuda", dtype=torch.bfloat16, generator=gen) / N**0.5
    runner = MoeRunnerConfig(inplace=False)
    out = table_path(args.out_dir, triton.__version__, E, N, device_name)
    result: dict = {
        "hardware": environment(),
        "shape": {"experts": E, "width": N, "hidden": K, "topk": args.topk},
        "candidates": len(candidates),
        "triton": triton.__version__,
        "rows": [],
    }
    started = time.perf_counter()
    for m in [int(b) for b in args.batches.split(",")]:
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16, generator=gen)
        scores = torch.rand(m, E, device="cuda", generator=gen)
        weights, ids = scores.topk(args.topk, dim=-1)
        topk = StandardTopKOutput((weights / weights.sum(-1, keepdim=True)).float(), ids.int(), scores)

        def call(x=x, topk=topk):
            return triton_utils.fused_experts(x, w1, w2, topk, runner)

        default = get_default_config(m, E, N, K, args.topk, None, False)
        default_s = time_call(call)
        best_s, best = default_s, default
        for cfg in candidates:
            with triton_utils.override_config(cfg):
                try:
                    seconds = time_call(call)
                except Exception as exc:  # a config this chip cannot run (shared memory, registers)
                    print(f"M={m} {cfg}: {type(exc).__name__}", file=sys.stderr)
                    continue
            if seconds < best_s:
                best_s, best = seconds, cfg
        row = {
            "batch": m,
            "default_us": round(default_s * 1e6, 1),
            "tuned_us": round(best_s * 1e6, 1),
            "speedup": round(default_s / best_s, 3),
            "config": best,
        }
        result["rows"].append(row)
        write_table(out, result["rows"])  # after every batch size: a cut-short run keeps its rows
        print(row, file=sys.stderr, flush=True)
    result.update(written=str(out), seconds=round(time.perf_counter() - started, 1))
    emit(result)


if __name__ == "__main__":
    main()
