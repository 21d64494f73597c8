"""A whole colocated GRPO step through the real runner (Ray, the recipe's backends), split by phase.

Runs examples/reasoning/main_grpo.py with the Moonlight recipe scaled to one GPU (TP = EP = 1,
SGLang with triton attention) on the Moonlight-shaped slice, a dataset of fixed-length prompts, and
the runner's own timers: time/rollout, reward, logprobs, train, weight_sync and the colocated
memory transitions (grouped as offload_onload), with memory/<transition>_gib after each. Step 1
(engine warm-up, first kernels) is dropped; the figures are the mean of the later steps. Under
`actor.offload_between_phases: auto`, when step 1 decides to keep the actor resident, step 2 onloads
it once (and recaptures its CUDA graphs): it is reported as `transition_step`, and the mean starts
at step 3.

    python -m benchmarks.grpo_step_runner [--actor megatron|torch] [--rollout sglang|torch]
        [--prompts 32] [--group-size 8] [--prompt-len 256] [--new-tokens 512] [--steps 3]
        [--sweep-new-tokens 256,1024] [--sweep-prompts 8,16] [--plot docs/grpo_step_runner.png]
    python -m benchmarks.grpo_step_runner --routing-replay none,measure,replay
        # one run per algorithm.routing_replay.mode instead of "main" (docs/routing_replay.md):
        # routing agreement without replay, logprob mismatch off and on, the feature's time and bytes
    python -m benchmarks.grpo_step_runner --staleness 0,1 --steps 4
        # one run per runner.max_staleness bound instead of "main", both roles resident
        # (actor.offload_between_phases=false) and the off-policy loss on in each, so the bound is
        # the only difference: step throughput, its ratio to the first bound's, the staleness metrics
    python -m benchmarks.grpo_step_runner --smoke  # CPU: the tiny recipe, torch backends, 2 steps
    python -m benchmarks.grpo_step_runner --plot-rows a/rows.jsonl b/rows.jsonl --plot scaling.png
        # one plot from the rows of several runs

Every run is a fresh process (engine and actor start-up are not in the step figures; they are
reported as startup_seconds). No checkpoint is written unless --save-at-end (a Megatron slice
checkpoint with its optimizer state is about 35 GB). Prints one JSON object; each run's row is also
appended to <work-dir>/rows.jsonl as it ends, and the full logs stay in --work-dir.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import ROOT, kill_run, start_recipe, stop_runs_on_sigterm

# Under TMPDIR: run_all.sh side-by-side gives each suite its own
BENCH_DIR = Path(tempfile.gettempdir()) / "rlinf-bench"

PHASES = ("rollout", "reward", "logprobs", "train", "weight_sync")
TRANSITIONS = (
    "rollout_release",
    "actor_onload",
    "rollout_resume_weights",
    "actor_offload",
    "rollout_resume_kv_cache",
)


def summarize(rows: list[dict[str, Any]], num_gpus: int = 1) -> dict[str, Any]:
    """Mean per-phase seconds, shares and tokens/s per GPU over the steady train steps: those after
    the first (warm-up) and, when `offload_between_phases: auto` decided in it to keep the actor
    resident, after the next one too, which onloads the actor once (and recaptures its CUDA graphs);
    that transition step is reported on its own."""
    steps = [r for r in rows if r.get("step", 0) >= 1 and "time/step" in r]
    if len(steps) < 2:
        raise ValueError(f"need at least 2 train steps in the metrics (step 1 is warm-up), got {len(steps)}")
    timed = steps[1:]
    transition: dict[str, Any] = {}
    if steps[0].get("actor/offload_between_phases") == 0.0 and len(timed) >= 2:
        first, timed = timed[0], timed[1:]
        transition = {
            "transition_step": {
                "step": first["step"],
                "step_seconds": round(float(first["time/step"]), 3),
                "once": {
                    k.removeprefix("time/"): round(float(first[k]), 3)
                    for k in ("time/actor_onload", "time/cuda_graph_capture")
                    if k in first
                },
            }
        }

    def mean(key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in timed) / len(timed)

    step = mean("time/step")
    seconds = {p: mean(f"time/{p}") for p in PHASES}
    seconds["offload_onload"] = sum(mean(f"time/{t}") for t in TRANSITIONS)
    seconds["other"] = max(0.0, step - sum(seconds.values()))  # advantages, driver glue, metrics
    tokens = mean("rollout/num_response_tokens")
    memory = {
        k.removeprefix("memory/"): round(mean(k), 2) for k in sorted(timed[-1]) if k.startswith("memory/")
    }
    # the start-up before step 1, as the run logged it at step 0: Ray, then each role's workers
    startup = {
        key.removeprefix("time/startup_"): round(float(value), 1)
        for row in rows
        if row.get("step") == 0
        for key, value in row.items()
        if key.startswith("time/startup_")
    }
    return {
        "startup_split_seconds": startup,
        "steps_timed": len(timed),
        "step_seconds": round(step, 3),
        "response_tokens": round(tokens),
        "response_tokens_per_s_per_gpu": round(tokens / step / num_gpus, 1),
        "phase_seconds": {k: round(v, 3) for k, v in seconds.items()},
        "phase_share": {k: round(v / step, 3) for k, v in seconds.items()},
        "memory_gib_after": memory,
        "logprob_abs_diff": round(mean("rollout/logprob_abs_diff"), 5),
        "logprob_abs_diff_max": round(
            max(float(r.get("rollout/logprob_abs_diff_max", 0.0)) for r in timed), 5
        ),
        **routing_summary(timed, mean),
        **staleness_summary(timed, mean),
        **transition,
    }


def staleness_summary(timed: list[dict[str, Any]], mean) -> dict[str, Any]:
    """With runner.max_staleness >= 1: the trained rows' mean and largest lag (policy versions),
    stale rows regenerated or dropped, and the share of tokens whose importance weight was capped."""
    if not any("staleness/mean" in r for r in timed):
        return {}
    return {
        "staleness_mean": round(mean("staleness/mean"), 3),
        "staleness_max": max(float(r.get("staleness/max", 0.0)) for r in timed),
        "stale_rows_regenerated": sum(float(r.get("staleness/regenerated_samples", 0.0)) for r in timed),
        "stale_rows_dropped": sum(float(r.get("staleness/dropped_samples", 0.0)) for r in timed),
        "tis_clip_fraction": round(mean("actor/tis_clip_fraction"), 5),
    }


# What every run of --staleness sets, so that the bound is the one difference between them
STALENESS_COMMON = (
    "actor.offload_between_phases=false",
    "algorithm.recompute_logprobs=true",
    "algorithm.rollout_is.mode=token_tis",
)


def one_run_each(name: str, values: list, extra, prompts: int, new_tokens: int) -> list[tuple]:
    """Plan entries, one run per value: result key `<name>_<value>`, tag `<name>-<value>`, the
    overrides `extra(value)`."""
    return [(f"{name}_{v}", prompts, new_tokens, f"{name}-{v}", extra(v), None) for v in values]


def staleness_runs(bounds: str, prompts: int, new_tokens: int) -> list[tuple]:
    """The plan entries of `--staleness 0,1`: one run per bound, each with STALENESS_COMMON."""
    values = [int(b) for b in bounds.split(",") if b]
    return one_run_each(
        "staleness", values, lambda k: (*STALENESS_COMMON, f"runner.max_staleness={k}"), prompts, new_tokens
    )


def staleness_speedup(result: dict[str, Any]) -> dict[str, Any]:
    """Each bound's response tokens/s over the first bound's (the reference run of the same call)."""
    runs = {k: v for k, v in result.items() if k.startswith("staleness_")}
    if len(runs) < 2:
        return {}
    first = next(iter(runs.values()))["response_tokens_per_s_per_gpu"]
    return {
        "staleness_speedup": {
            k: round(v["response_tokens_per_s_per_gpu"] / first, 3) for k, v in runs.items()
        }
    }


ROUTING_TIMES = ("time/routing_record", "time/routing_recompute", "time/routing_train")


def routing_summary(timed: list[dict[str, Any]], mean) -> dict[str, Any]:
    """With algorithm.routing_replay on: agreement, the recorded bytes and seconds per step."""
    if not any("routing/bytes" in r for r in timed):
        return {}
    out = {
        "routing_bytes": round(mean("routing/bytes")),
        **{k.removeprefix("time/") + "_seconds": round(mean(k), 4) for k in ROUTING_TIMES},
    }
    if any("routing/agreement" in r for r in timed):
        out["routing_agreement"] = round(mean("routing/agreement"), 5)
    return out


def write_prompts(path: Path, num: int, length: int, vocab: int, seed: int) -> None:
    """Prompts of exactly `length` word-level tokens ("t123" = id 123), answers that never match."""
    import random

    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(num):
            text = " ".join(f"t{rng.randrange(2, vocab)}" for _ in range(length))
            f.write(json.dumps({"prompt": text, "solutions": ["1"]}) + "\n")


def overrides(args, checkpoint: Path, data: Path, out: Path, prompts: int, new_tokens: int) -> list[str]:
    responses = prompts * args.group_size
    common = [
        f"runner.max_steps={args.steps}",
        f"runner.save_at_end={str(args.save_at_end).lower()}",
        "runner.val_check_interval=0",
        "runner.save_interval=0",
        "runner.resume_dir=null",
        f"runner.output_dir={out / 'results'}",
        f"runner.logger.log_path={out / 'logs'}",
        "runner.logger.plot=false",
        f"data.rollout_batch_size={prompts}",
        f"algorithm.group_size={args.group_size}",
        f"algorithm.sampling_params.max_new_tokens={new_tokens}",
        f"actor.seq_length={args.prompt_len + new_tokens}",
        f"actor.global_batch_size={max(1, responses // args.minibatches)}",
        f"actor.micro_batch_size={args.micro_batch}",
        # the recipe's logprob rows are sized for its own micro-batch; here the logprob pass takes
        # --logprob-micro-batch rows, or the training micro-batch
        f"actor.logprob_micro_batch_size={args.logprob_micro_batch or 'null'}",
        f"actor.model.model_path={checkpoint}",
    ]
    if args.smoke:  # the tiny recipe's synthetic arithmetic prompts (the tiny tokenizer has no "t123")
        return common
    return [
        *common,
        f"data.train_data_paths=[{data}]",
        "data.val_data_paths=[]",
        f"data.max_prompt_length={args.prompt_len}",
        "cluster.num_gpus_per_node=1",
        f"actor.training_backend={args.actor}",
        f"rollout.rollout_backend={args.rollout}",
        "actor.model.trust_remote_code=false",
        "actor.model.tensor_model_parallel_size=1",
        "actor.model.expert_model_parallel_size=1",
        "actor.model.sequence_parallel=false",
        "rollout.tensor_parallel_size=1",
        "rollout.sglang.attention_backend=triton",
        f"rollout.gpu_memory_utilization={args.rollout_memory}",
        f"reward.num_workers={args.reward_workers}",
        *args.override,
    ]


def run_once(
    args,
    checkpoint: Path,
    prompts: int,
    new_tokens: int,
    tag: str,
    extra: tuple[str, ...] = (),
    timeout: float | None = None,
) -> dict[str, Any]:
    out = Path(args.work_dir) / tag
    out.mkdir(parents=True, exist_ok=True)
    data = out / "prompts.jsonl"
    if not args.smoke:
        write_prompts(data, prompts * args.steps, args.prompt_len, args.vocab, seed=len(tag))
    recipe = "tiny-moe-grpo-cpu" if args.smoke else "moonlight-16b-grpo-megatron"
    shutil.rmtree(out / "logs", ignore_errors=True)  # an earlier run's metrics are not this run's
    started = time.perf_counter()
    timeout = args.timeout if timeout is None else timeout
    timed_out = False
    proc = start_recipe(
        recipe, [*overrides(args, checkpoint, data, out, prompts, new_tokens), *extra], out / "run.log"
    )
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        # The steps logged so far still make a figure (a slow final checkpoint save must not cost the
        # measured steps).
        kill_run(proc)
        code, timed_out = 0, True
    wall = time.perf_counter() - started
    metrics = out / "logs" / "metrics.jsonl"
    if code != 0 or not metrics.is_file():
        tail = (out / "run.log").read_text()[-3000:]
        why = (
            f"timed out after {timeout:.0f} s before logging a step" if timed_out else f"failed (exit {code})"
        )
        raise SystemExit(f"run {tag} {why}; log {out / 'run.log'}:\n{tail}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    try:
        summary = summarize(rows) | ({"timed_out_after_s": round(timeout)} if timed_out else {})
    except ValueError as err:
        why = f"timed out after {timeout:.0f} s" if timed_out else "finished"
        raise SystemExit(f"run {tag} {why}, too early for a figure: {err}; log {out / 'run.log'}") from None
    step_total = sum(r.get("time/step", 0.0) for r in rows if r.get("step", 0) >= 1)
    row = {
        "tag": tag,
        "prompts": prompts,
        "responses": prompts * args.group_size,
        "new_tokens": new_tokens,
        "startup_seconds": round(wall - step_total, 1),
        **summary,
    }
    print(f"[{tag}] {json.dumps(row)}", file=sys.stderr, flush=True)
    with (Path(args.work_dir) / "rows.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def scaling_series(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of several calls as the plot's two series: response length at the most common batch,
    batch at the most common response length (a row can sit in both)."""
    from collections import Counter

    if not rows:
        raise SystemExit("--plot-rows: no rows in the files given")
    batch = Counter(r["responses"] for r in rows).most_common(1)[0][0]
    length = Counter(r["new_tokens"] for r in rows).most_common(1)[0][0]
    return [r | {"varied": "new_tokens"} for r in rows if r["responses"] == batch] + [
        r | {"varied": "responses"} for r in rows if r["new_tokens"] == length
    ]


def word_level_tokenizer(checkpoint: Path, vocab_size: int, eos_id: int) -> None:
    """A tokenizer with one token per id ("t123"): the random slice has none, and the rollout decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"t{eos_id}", pad_token="t0")
    fast.save_pretrained(checkpoint)


def build_checkpoint(path: Path, layers: int = 4) -> Path:
    """The Moonlight slice of `layers` layers with a word-level tokenizer, built on the GPU unless
    present (a checkpoint of another depth at `path` is an error, not reused). The build runs in a
    child process: this one lives through the runs it measures, and the builder's CUDA cache (28 GiB
    at 12 layers) would stay on the GPU beside them."""
    if (path / "tokenizer.json").is_file():
        built = json.loads((path / "config.json").read_text())["num_hidden_layers"]
        if built != layers:
            raise SystemExit(f"--checkpoint {path} holds a {built}-layer slice, not --layers {layers}")
        return path
    from rlinf.models.slice import moonlight_slice_config

    staging = path.with_name(f".{path.name}.tmp-{os.getpid()}")  # renamed into place when whole
    subprocess.run(
        [sys.executable, "-m", "rlinf.models.slice", "--out", str(staging), "--layers", str(layers),
         "--dtype", "bf16", "--device", "cuda"],
        cwd=ROOT, check=True,
    )  # fmt: skip
    fields = moonlight_slice_config(layers)
    word_level_tokenizer(staging, fields["vocab_size"], fields["eos_token_id"])
    try:
        staging.rename(path)
    except OSError:  # another process put a whole one there first
        shutil.rmtree(staging, ignore_errors=True)
    return path


def plot(sweep: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in (
        (axes[0], "new_tokens", "response length (tokens)"),
        (axes[1], "responses", "responses per step"),
    ):
        rows = sorted((r for r in sweep if r["varied"] == key), key=lambda r: r[key])
        if not rows:
            continue
        xs = [r[key] for r in rows]
        bottom = [0.0] * len(rows)
        for phase in ("rollout", "reward", "logprobs", "train", "weight_sync", "offload_onload"):
            ys = [r["phase_seconds"].get(phase, 0.0) for r in rows]
            ax.bar([str(x) for x in xs], ys, bottom=bottom, label=phase)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
        ax.set_xlabel(label)
        ax.set_ylabel("step seconds")
        fixed = rows[0]
        other = (
            f"{fixed['responses']} responses" if key == "new_tokens" else f"{fixed['new_tokens']} new tokens"
        )
        ax.set_title(f"colocated GRPO step, 1 GPU ({other})")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--layers",
        type=int,
        default=4,
        help="slice depth (rlinf.models.memory_plan says what trains on one GPU)",
    )
    parser.add_argument(
        "--checkpoint", default=None, help="default $TMPDIR/rlinf-bench/moonlight-slice-<layers>l-tok"
    )
    parser.add_argument("--work-dir", default=str(BENCH_DIR / "grpo-step-runner"))
    parser.add_argument("--actor", default="megatron", choices=("megatron", "torch"))
    parser.add_argument("--rollout", default="sglang", choices=("sglang", "torch"))
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--minibatches", type=int, default=4, help="optimizer steps per GRPO step (recipe: 4)"
    )
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument(
        "--logprob-micro-batch",
        type=int,
        default=None,
        help="rows a logprob forward (default: --micro-batch)",
    )
    parser.add_argument("--rollout-memory", type=float, default=0.5)
    parser.add_argument("--reward-workers", type=int, default=8)
    parser.add_argument("--sweep-new-tokens", default="")
    parser.add_argument("--sweep-prompts", default="")
    parser.add_argument("--plot", default="")
    parser.add_argument(
        "--timeout", type=int, default=3600,
        help="seconds for all runs together; each run gets an equal share of what is left when it starts",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--save-at-end", action="store_true", help="keep the runner's final checkpoint save")
    parser.add_argument(
        "--routing-replay", default="", metavar="MODES",
        help="comma list of algorithm.routing_replay.mode values (none,measure,replay): one run each, instead of main",
    )  # fmt: skip
    parser.add_argument(
        "--staleness", default="", metavar="BOUNDS",
        help="comma list of runner.max_staleness values: one run each, both roles resident, instead of main",
    )  # fmt: skip
    parser.add_argument("--plot-rows", nargs="+", type=Path, default=None, metavar="ROWS_JSONL")
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE",
        help="one more recipe override, e.g. actor.offload_between_phases=false",
    )  # fmt: skip
    args = parser.parse_args()
    if args.plot_rows:
        rows = [json.loads(line) for f in args.plot_rows for line in f.read_text().splitlines() if line]
        path = args.plot or "grpo_step_scaling.png"
        plot(scaling_series(rows), Path(path))
        print(json.dumps({"plot": path, "rows": len(rows)}))
        return

    deadline = time.perf_counter() + args.timeout  # the slice build counts: the caller's timeout does
    if args.smoke:
        checkpoint, args.vocab = "tiny://bootstrap", 10
        args.prompts, args.group_size, args.prompt_len, args.new_tokens = 2, 2, 64, 8
        args.steps, args.micro_batch, args.minibatches = 2, 2, 1
        args.work_dir = args.work_dir + "-smoke"
    else:
        from rlinf.models.slice import moonlight_slice_config

        path = args.checkpoint or BENCH_DIR / f"moonlight-slice-{args.layers}l-tok"
        checkpoint = build_checkpoint(Path(path), args.layers)
        args.vocab = moonlight_slice_config(args.layers)["vocab_size"]
    result: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "actor": "torch" if args.smoke else args.actor,
        "rollout": "torch" if args.smoke else args.rollout,
        "layers": None if args.smoke else args.layers,
        "prompt_len": args.prompt_len,
        "group_size": args.group_size,
        "sweep": [],
    }
    modes = [m for m in args.routing_replay.split(",") if m]
    # (result key, prompts, new tokens, tag, overrides, varied): the runs, in order
    plan = one_run_each(
        "routing", modes, lambda m: (f"algorithm.routing_replay.mode={m}",), args.prompts, args.new_tokens
    )
    plan += staleness_runs(args.staleness, args.prompts, args.new_tokens)
    plan = plan or [("main", args.prompts, args.new_tokens, "main", (), None)]
    plan += [
        ("sweep", args.prompts, int(n), f"new{n}", (), "new_tokens")
        for n in args.sweep_new_tokens.split(",")
        if n
    ]
    plan += [
        ("sweep", int(p), args.new_tokens, f"prompts{p}", (), "responses")
        for p in args.sweep_prompts.split(",")
        if p
    ]
    for i, (key, prompts, new_tokens, tag, extra, varied) in enumerate(plan):
        share = (deadline - time.perf_counter()) / (len(plan) - i)  # what is left, split over the runs left
        row = run_once(args, checkpoint, prompts, new_tokens, tag, extra, timeout=max(share, 1.0))
        if varied:
            result["sweep"].append(row | {"varied": varied})
        else:
            result[key] = row
    result |= staleness_speedup(result)
    if args.plot and result["sweep"] and "main" in result:
        shared = [result["main"] | {"varied": key} for key in ("new_tokens", "responses")]
        plot(result["sweep"] + shared, Path(args.plot))
        result["plot"] = args.plot
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    stop_runs_on_sigterm()
    main()
