"""One recipe's learning over several seeds and actors, the runs side by side, and what they add up to:
each run's greedy validation gain, and per variant the mean, the lowest and the gap to the first.

    python -m benchmarks.learning_seeds tiny-moe-grpo-gpu --seeds 1234,1,2 --out /tmp/curves \
        --variant megatron-te --variant torch=actor.training_backend=torch,actor.model.precision=fp32 \
        [--parallel 3] [--timeout 540] [--plot curves.png] [KEY=VALUE ...]

A variant is NAME or NAME=OVERRIDE,OVERRIDE (none: the recipe as it is); trailing KEY=VALUE
overrides go to every run. Each run is `examples/reasoning/main_grpo.py RECIPE runner.seed=S` with
its own folders, OUT/TAG/{run.log,logs/metrics.jsonl} (TAG = NAME-sSEED), as a user would run it.

- At most --parallel runs at once (default: 3 per GPU, 1 without one), dealt round-robin over the
  visible GPUs, one each (CUDA_VISIBLE_DEVICES).
- SGLang's `mem_fraction_static` is a share of the memory free when an engine starts, so runs that
  share a GPU each get the recipe's `rollout.gpu_memory_utilization` divided by their number: the
  engines then fit side by side. Learning does not depend on it (the KV cache still holds the
  step's batch many times over); step times do, and are not the point here.
- A tiny:// model is built into the cache once, before the runs (its lock would make them queue).
- --timeout bounds the whole call: a run still going then is stopped, and the validations it logged
  are reported with `cut_off_at_step`.
- A run that fails before its first validation is started again once, after the runs waiting to
  start (engines that start side by side can each see memory that another is about to take); the
  failed attempt's log is kept as run.attempt1.log, and its result says `restarted`.

Progress: one line per validation a run logs. Prints one JSON object; the exit status is 1 when a
run failed (not when it was cut off by --timeout).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks._common import emit, kill_run, start_recipe, stop_runs_on_sigterm
from benchmarks.learning_curves import plot, read_rows, series, summarize

RUNS_PER_GPU = 3
POLL_S = 5.0


@dataclass
class Run:
    tag: str
    overrides: list[str]
    folder: Path
    variant: str = "recipe"
    gpu: int | None = None
    proc: subprocess.Popen | None = None
    code: int | None = None
    cut_off: bool = False
    restarted: bool = False
    reported: set[int] = field(default_factory=set)

    @property
    def metrics(self) -> Path:
        return self.folder / "logs" / "metrics.jsonl"


def parse_variant(spec: str) -> tuple[str, list[str]]:
    name, _, overrides = spec.partition("=")
    if not name:
        raise ValueError(f"--variant {spec!r}: expected NAME or NAME=KEY=VALUE,KEY=VALUE")
    return name, [o for o in overrides.split(",") if o]


def visible_gpus() -> list[int]:
    try:
        import torch
    except ImportError:
        return []
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def memory_share(recipe: str, overrides: list[str], runs_on_one_gpu: int) -> list[str]:
    """The override that lets `runs_on_one_gpu` SGLang engines fit on one GPU (none when the runs
    have a GPU each, the rollout is not SGLang, or the user set the share)."""
    if runs_on_one_gpu <= 1 or any(o.startswith("rollout.gpu_memory_utilization=") for o in overrides):
        return []
    from rlinf.config import load_config

    cfg = load_config(recipe, overrides)
    if cfg.rollout.rollout_backend != "sglang":
        return []
    return [f"rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization / runs_on_one_gpu:.3g}"]


def plan_runs(args, gpus: list[int]) -> list[Run]:
    variants = [parse_variant(v) for v in args.variant or ["recipe"]]
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = []
    for name, extra in variants:
        for seed in seeds:
            tag = f"{name}-s{seed}"
            folder = Path(args.out) / tag
            overrides = [
                f"runner.seed={seed}",
                f"runner.output_dir={folder / 'results'}",
                f"runner.logger.log_path={folder / 'logs'}",
                *extra,
                *args.overrides,
            ]
            runs.append(Run(tag, overrides, folder, name, gpus[len(runs) % len(gpus)] if gpus else None))
    sharing = min(args.parallel, len(runs))
    per_gpu = -(-sharing // len(gpus)) if gpus else 1
    for run in runs:
        run.overrides += memory_share(args.recipe, run.overrides, per_gpu)
    return runs


def build_tiny_model(recipe: str, overrides: list[str]) -> None:
    from rlinf.config import load_config
    from rlinf.models.tiny import resolve_model_path

    path = load_config(recipe, overrides).actor.model.model_path
    if path.startswith("tiny://"):
        print(f"learning_seeds: {path} -> {resolve_model_path(path)}", file=sys.stderr, flush=True)


def report_progress(run: Run) -> None:
    if not run.metrics.is_file():
        return
    steps, values = series(read_rows(run.metrics), "val/accuracy")
    for step, value in zip(steps, values, strict=True):
        if step not in run.reported:
            run.reported.add(step)
            print(f"[{run.tag}] step {step}: greedy val accuracy {value:.3f}", file=sys.stderr, flush=True)


def run_all(runs: list[Run], recipe: str, parallel: int, deadline: float) -> None:
    waiting, going = list(runs), []
    while waiting or going:
        while waiting and len(going) < parallel and time.monotonic() < deadline:
            run = waiting.pop(0)
            run.folder.mkdir(parents=True, exist_ok=True)
            env = None if run.gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": str(run.gpu)}
            run.proc = start_recipe(recipe, run.overrides, run.folder / "run.log", env=env)
            print(f"[{run.tag}] started (GPU {run.gpu})", file=sys.stderr, flush=True)
            going.append(run)
        if not going:
            break  # the deadline passed with runs still waiting: they never start
        time.sleep(POLL_S)
        for run in list(going):
            report_progress(run)
            if run.proc.poll() is not None:
                run.code = run.proc.returncode
            elif time.monotonic() >= deadline:
                kill_run(run.proc)
                run.cut_off = True
            else:
                continue
            report_progress(run)
            going.remove(run)
            if run.code and not run.reported and not run.restarted:
                print(f"[{run.tag}] exit {run.code} before its first validation: started again later",
                      file=sys.stderr, flush=True)  # fmt: skip
                set_aside_failed_attempt(run)
                waiting.append(run)
                continue
            print(
                f"[{run.tag}] {'cut off' if run.cut_off else f'exit {run.code}'}", file=sys.stderr, flush=True
            )


def set_aside_failed_attempt(run: Run) -> None:
    """Keep a failed first attempt's log beside the run's and clear its metrics for the second."""
    (run.folder / "run.log").replace(run.folder / "run.attempt1.log")
    run.metrics.unlink(missing_ok=True)
    run.restarted, run.code, run.proc = True, None, None


def run_result(run: Run) -> dict:
    rows = read_rows(run.metrics) if run.metrics.is_file() else []
    result = {"gpu": run.gpu, "exit": run.code, **(summarize(rows) if rows else {})}
    if run.cut_off:
        result["cut_off_at_step"] = result.get("steps", 0)
    if run.restarted:
        result["restarted"] = True
    if run.proc is None:
        result["not_started"] = True
    return result


def variant_summary(results: list[dict]) -> dict:
    """One variant's runs: how many, how many logged a gain (two validations), their mean and lowest."""
    measured = [r for r in results if "gain_points" in r]
    summary = {"runs": len(results), "runs_with_a_gain": len(measured)}
    if measured:
        summary |= {
            "gain_mean_points": round(statistics.fmean(r["gain_points"] for r in measured), 1),
            "gain_min_points": min(r["gain_points"] for r in measured),
            "val_first_mean": round(statistics.fmean(r["val_first"] for r in measured), 4),
            "val_last_mean": round(statistics.fmean(r["val_last"] for r in measured), 4),
        }
    return summary


def summarize_runs(runs: list[Run]) -> dict:
    results = {run.tag: run_result(run) for run in runs}
    by_variant: dict[str, list[dict]] = {}
    for run in runs:
        by_variant.setdefault(run.variant, []).append(results[run.tag])
    variants = {name: variant_summary(rows) for name, rows in by_variant.items()}
    first = next(iter(variants.values()))
    for summary in variants.values():
        if "gain_mean_points" in summary and "gain_mean_points" in first:
            summary["gain_mean_minus_first_points"] = round(
                summary["gain_mean_points"] - first["gain_mean_points"], 1
            )
    return {"runs": results, "variants": variants}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every run")
    parser.add_argument("--seeds", default="1234,1,2")
    parser.add_argument("--variant", action="append", help="NAME or NAME=KEY=VALUE,KEY=VALUE (repeatable)")
    parser.add_argument("--out", required=True, help="a folder per run goes here")
    parser.add_argument("--parallel", type=int, default=None, help="runs at once (3 per GPU, 1 without)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds for the whole call")
    parser.add_argument("--plot", help="PNG of every run's curves")
    args = parser.parse_intermixed_args(argv)
    gpus = visible_gpus()
    args.parallel = args.parallel or (RUNS_PER_GPU * len(gpus) if gpus else 1)
    started = time.monotonic()
    try:
        runs = plan_runs(args, gpus)
    except ValueError as err:
        parser.error(str(err))
    build_tiny_model(args.recipe, runs[0].overrides)
    deadline = started + args.timeout if args.timeout else float("inf")
    run_all(runs, args.recipe, args.parallel, deadline)
    result = {
        "benchmark": "learning_seeds",
        "recipe": args.recipe,
        "gpus": len(gpus),
        "parallel": args.parallel,
        "overrides": {run.tag: run.overrides for run in runs},
        **summarize_runs(runs),
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.plot:
        rows = {run.tag: read_rows(run.metrics) for run in runs if run.metrics.is_file()}
        result["plot"] = str(plot(rows, args.plot, f"{args.recipe}: {len(rows)} runs"))
    emit(result)
    return 1 if any(run.code not in (0, None) for run in runs) else 0


if __name__ == "__main__":
    stop_runs_on_sigterm()
    raise SystemExit(main())
