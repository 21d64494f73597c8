"""Training throughput of the Megatron actor against the HF (torch) actor, in the same run.

Both actors train on the same synthetic GRPO batch (fixed prompt / response lengths) of the same
checkpoint, one after the other on one GPU, with the optimizer settings of a recipe's actor.optim
(--recipe; the Moonlight recipe's precision-aware optimizer with bf16 Adam moments by default). Each
actor does one warm-up `train` call, then `--repeats` runs (default 3) of `--steps` timed calls, each
run followed by one profiled call under --profile. Prints one JSON object; each actor's figures are
the medians over its runs (figure by figure), its `runs` the per-run values:

    tokens_per_s   (prompt + response tokens through forward + backward) / train wall time
    mfu            model FLOPs / (wall time x peak bf16 dense FLOP/s of the GPU, --peak-tflops)
    tflop_per_s    model FLOPs / wall time
    max_memory_gib peak allocated GPU memory of the run
    with --profile: train_call_span_ms, gpu_busy_ms, gpu_idle_ms, gpu_busy_share, kernels

Model FLOPs per token: 6 x (parameters a token activates: attention, dense MLP, shared experts, top-k
routed experts, router, LM head; not the embedding lookup) + causal attention 6 x layers x heads x
(qk_dim + v_dim) x mean context. The logprob recompute is not timed.

    python -m benchmarks.actor_throughput --model DIR [--precision bf16] [--rows 16]
        [--prompt 256] [--response 768] [--steps 2] [--repeats 3] [--micro-batch 4] [--logprob-micro-batch N] [--peak-tflops 989]
        [--recipe moonlight-16b-grpo-megatron]
        [--profile DIR]  # then a GPU-only trace of one more train call per run, summarised
                         # (busy / idle share, top kernels; benchmarks/trace_summary.py)
        [--profile-host]  # with --profile: also CPU activity with Python stacks, summarised as the
                          # top host ops and the device->host syncs (.item(), .tolist()) with their
                          # Python call sites where the profiler links them (torch 2.11 links none
                          # while CUDA activity is profiled: the counts and op names remain),
                          # and each idle gap of that call put down to a host sync, a late launch
                          # or a dependency, with the host ops around it and the project's
                          # Python frame the host ran meanwhile (benchmarks/idle_gaps.py)
        [--megatron-grouped-gemm]  # Megatron actor with actor.model.moe_grouped_gemm: true (without
                                   # TE: rlinf's grouped-GEMM experts instead of SequentialMLP)
        [--backends torch,megatron,megatron-te-free]  # megatron: the spec this machine runs (TE's
                                   # when installed); megatron-te-free: the TE-free spec, in a child
                                   # process with RLINF_MEGATRON_TE=off (the same run, the same GPU)
        [--megatron-variants gradient_accumulation_fusion=false,moe_permute_fusion=false]
                                   # one more Megatron run per entry, with that provider setting
                                   # (rlinf.config.megatron_settings) changed: each fusion's share;
                                   # an actor.model key changes the recipe instead, e.g.
                                   # moe_grouped_gemm_impl=torch: rlinf's grouped_mm experts in the
                                   # TE spec, against TEGroupedMLP in the same process;
                                   # micro_batch_size=N (or logprob_micro_batch_size=N): N rows a
                                   # train (logprob) forward instead of --micro-batch's;
                                   # cuda_graph_impl=transformer_engine: per-layer CUDA graphs
                                   # (figures cuda_graph_layers, _captures, _capture_s); ";" joins
                                   # settings of one variant, "+" a list's items:
                                   # "cuda_graph_impl=transformer_engine;cuda_graph_modules=attn+mlp"
        [--megatron-setting attention_backend=unfused]  # a provider setting of every TE Megatron
                                   # actor of the run (repeatable); TE's core attention kernel is one
                                   # per process, so it is a setting, not a variant
        [--emulate-rank]  # with --backends megatron: the Megatron actor as rank 0 of the recipe's
                          # actor.model layout (TP / EP / ETP, SP, dispatcher, recompute), its
                          # collectives stand-ins that move nothing (benchmarks/rank_emulation.py),
                          # random weights (DIR needs only config.json), routing uniform at random;
                          # FLOPs and tokens/s are the rank's, and `prediction` is the recipe's
                          # per-GPU actor time per step (benchmarks/rank_prediction.py); each
                          # --megatron-variants entry is another emulated actor of the same run,
                          # with its own `prediction[VARIANT]`
    (DIR: an HF DeepSeek-V3 checkpoint, e.g. python -m rlinf.models.slice --out DIR)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import torch

from benchmarks._common import GcTime, ensure_tokenizer, release
from benchmarks.megatron_variants import (
    BATCH_KEYS,
    parse_setting,
    parse_variant,
    provider_overrides,
    with_model_keys,
)
from rlinf.config.schema import ActorConfig, AlgorithmConfig, Config, ModelConfig, OptimConfig, RunnerConfig
from rlinf.data.batch import RolloutBatch


def flops_per_token(config: dict, context: float) -> float:
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_rank = config["num_attention_heads"], config["kv_lora_rank"]
    nope, rope, v = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    q_rank = config.get("q_lora_rank")
    q = h * heads * (nope + rope) if not q_rank else h * q_rank + q_rank * heads * (nope + rope)
    attention = q + h * (kv_rank + rope) + kv_rank * heads * (nope + v) + heads * v * h
    dense_mlp = 3 * h * config["intermediate_size"]
    expert = 3 * h * config["moe_intermediate_size"]
    moe_mlp = (
        expert * (config["num_experts_per_tok"] + config["n_shared_experts"]) + h * config["n_routed_experts"]
    )
    dense_layers = config["first_k_dense_replace"]
    active = layers * attention + dense_layers * dense_mlp + (layers - dense_layers) * moe_mlp
    active += h * config["vocab_size"]  # LM head
    attention_scores = 6 * layers * heads * (nope + rope + v) * context / 2  # causal: half the context
    return 6 * active + attention_scores


def batch(vocab: int, rows: int, prompt: int, response: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    return RolloutBatch(
        prompt_ids=torch.randint(3, vocab, (rows, prompt), generator=g),
        prompt_mask=torch.ones(rows, prompt, dtype=torch.bool),
        response_ids=torch.randint(3, vocab, (rows, response), generator=g),
        response_mask=torch.ones(rows, response, dtype=torch.bool),
        group_index=torch.arange(rows) // 4,
        rollout_logprobs=torch.zeros(rows, response),
        finish_reasons=["length"] * rows,
        response_text=[""] * rows,
        solutions=[("0",)] * rows,
        advantages=torch.randn(rows, generator=g),
    )


def measure_te_free(argv: list[str]) -> dict:
    """The Megatron actor on the TE-free spec: this benchmark again, megatron only, in a child process
    where Transformer Engine is switched off (it is chosen when megatron is first imported)."""
    args = [a for a in argv if not a.startswith("--backends=")]
    if "--backends" in args:
        i = args.index("--backends")
        del args[i : i + 2]
    # the TE actors' settings and variants, and the parent's profile file names, stay the parent's
    for flag in ("--megatron-variants", "--megatron-setting", "--profile"):
        while flag in args:
            i = args.index(flag)
            del args[i : i + 2]
    env = {**os.environ, "RLINF_MEGATRON_TE": "off", "MASTER_PORT": "29512"}  # the parent holds 29511
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.actor_throughput", *args, "--backends", "megatron"],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"TE-free run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["megatron"]


@dataclass(frozen=True)
class Shape:
    """What one measured run converts its time into."""

    steps: int  # timed train calls per run
    tokens: int  # per train call
    flops: float  # model FLOPs per train call
    peak_tflops: float


def measure(
    backend: str,
    cfg: Config,
    data: RolloutBatch,
    shape: Shape,
    repeats: int,
    profile: Path | None = None,
    host: bool = False,
    label: str | None = None,
) -> tuple[list[dict], dict | None]:
    """One actor, one warm-up `train` call, then `repeats` runs of `shape.steps` timed calls (each
    followed by one profiled call with `profile`); (the runs' figures, the actor's spec or None).
    `label`: the run's name in the results (a variant's), for its trace files. Each run also times
    one `compute_logprobs` call over the same batch (the step's logprob phase)."""
    if backend == "megatron":
        from rlinf.workers.actor.megatron_actor import MegatronActor as Actor
    else:
        from rlinf.workers.actor.torch_actor import TorchActor as Actor  # type: ignore[assignment]
    from rlinf.workers.actor.base import with_logprobs

    actor = Actor(replace(cfg, actor=replace(cfg.actor, training_backend=backend)))
    spec = getattr(actor, "spec", None)
    data = with_logprobs(data, [actor.compute_logprobs(data)])
    warm_up = actor.train(data, step=0)
    graphs = getattr(actor, "graphs", None)  # the Megatron actor's CUDA graphs, when the recipe asks
    # a variant's trace gets its own file name (megatron[moe_grouped_gemm_impl=torch] -> megatron_moe_...)
    file_name = re.sub(r"[^\w.-]+", "_", label or backend).strip("_")
    runs = []
    for run in range(repeats):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        with GcTime() as collector:
            for step in range(shape.steps):
                actor.train(data, step=1 + run * shape.steps + step)
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / shape.steps
        figures = {
            "seconds_per_train_call": seconds,
            # Python's garbage collector inside the timed calls (host time the GPU may wait for)
            "gc_ms_per_train_call": 1e3 * collector.seconds / shape.steps,
            "gc_full_collections_per_train_call": collector.collections[2] / shape.steps,
            "tokens_per_s": shape.tokens / seconds,
            "mfu": shape.flops / seconds / (shape.peak_tflops * 1e12),
            "tflop_per_s": shape.flops / seconds / 1e12,
            "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        }
        start = time.perf_counter()
        actor.compute_logprobs(data)
        torch.cuda.synchronize()
        figures["seconds_per_logprob_call"] = time.perf_counter() - start
        figures["seconds_per_optimizer_step"] = optimizer_step_seconds(actor, data, step=50 + run)
        if graphs is not None:
            figures.update(
                cuda_graph_layers=graphs.graphed_layers(),  # held through the timed calls
                cuda_graph_captures=graphs.captures,  # 1: captured at the warm-up call only
                cuda_graph_capture_s=warm_up["time/cuda_graph_capture"],
            )
        if profile:
            trace = profile_train_call(actor, data, profile / f"{file_name}.run{run}.trace.json", host)
            figures.update(profiled_figures(trace), profile_one_train_call=trace)
        runs.append(figures)
    release(actor)
    return runs, spec


def optimizer_step_seconds(actor, data: RolloutBatch, step: int) -> float:
    """Wall seconds of the optimizer phase in one more train call (one optimizer step a call: the
    benchmark's global batch is its rows): from the grad norm, with the backward's work finished,
    to the step's last kernel (nan when the call skipped its step). The recipe steps its optimizer
    once per global batch, not once per benchmark call, so the rank prediction counts this phase
    apart (benchmarks/rank_prediction.py)."""
    marks: list[float] = []
    clip, step_optimizer = actor.clip_grad_norm, actor.optimizer_step

    def timed_clip(max_norm: float) -> float:
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        return clip(max_norm)

    def timed_step() -> None:
        step_optimizer()
        torch.cuda.synchronize()
        marks.append(time.perf_counter())

    with (
        mock.patch.object(actor, "clip_grad_norm", timed_clip),
        mock.patch.object(actor, "optimizer_step", timed_step),
    ):
        actor.train(data, step=step)
    return marks[1] - marks[0] if len(marks) == 2 else float("nan")  # nan: the call stepped nothing


def profiled_figures(trace: dict) -> dict:
    """The headline figures of one profiled train call (benchmarks/trace_summary.py)."""
    return {
        "train_call_span_ms": trace["span"],
        "gpu_busy_ms": trace["gpu_busy"],
        "gpu_idle_ms": trace["gpu_idle"],
        "gpu_busy_share": trace["gpu_busy_share"],
        "kernels": trace["kernels_launched"],
    }


def median_of_runs(runs: list[dict]) -> dict:
    """Each figure's median over the runs (figure by figure, not the median run's), and the runs."""
    numbers = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {**{k: statistics.median(run[k] for run in runs) for k in numbers}, "runs": runs}


def profile_train_call(actor, data: RolloutBatch, trace: Path, host: bool = False) -> dict:
    """GPU-only trace of one train call, summarised; with `host`, a second call profiled with CPU
    activity and Python stacks adds the host side (it slows the host, so its GPU figures are not used)."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.idle_gaps import idle_gaps
    from benchmarks.trace_summary import load_events, summarize

    trace.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        actor.train(data, step=99)
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    summary = summarize(load_events(trace), steps=1)
    if host:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
            actor.train(data, step=100)
            torch.cuda.synchronize()
        host_trace = trace.with_name(trace.name.replace(".trace.json", ".host.trace.json"))
        prof.export_chrome_trace(str(host_trace))
        summary["host"] = host_summary(prof) | {"idle_gaps": idle_gaps(load_events(host_trace))}
    return summary


PYTHON_FRAME = re.compile(r".+\(\d+\): ")  # the profiler's name for a Python frame: "file.py(12): function"
SYNC_OPS = (
    "aten::_local_scalar_dense",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
)


def host_summary(prof, top: int = 15) -> dict:
    """The host ops with the most self CPU time, and the Python call sites that synchronise with the
    device most (each sync idles the GPU until the host has launched work again)."""
    from collections import Counter

    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    sites: Counter = Counter()
    for event in prof.events():
        if event.name in SYNC_OPS:
            sites[(event.name, python_frames(event))] += 1
    return {
        "top_host_ops_self_ms": [
            {"op": e.key, "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2)}
            for e in ops[:top]
        ],
        "syncs": {k: sum(n for (op, _), n in sites.items() if op == k) for k in SYNC_OPS},
        "sync_sources": [
            {"op": op, "calls": n, "python": list(frames)} for (op, frames), n in sites.most_common(top)
        ],
    }


def python_frames(event, depth: int = 5) -> tuple[str, ...]:
    """The innermost `depth` Python frames (profiler events named `file.py(line): function`) above an op."""
    frames = []
    parent = event.cpu_parent
    while parent is not None and len(frames) < depth:
        if PYTHON_FRAME.match(parent.name):
            frames.append(parent.name.split("site-packages/")[-1])
        parent = parent.cpu_parent
    return tuple(frames)


def recipe_optim(recipe: str) -> OptimConfig:
    """The recipe's actor.optim section, typed (the HF actor reads what AdamW takes of it)."""
    from rlinf.config.loader import compose_recipe
    from rlinf.config.typed import from_dict

    return from_dict(OptimConfig, compose_recipe(recipe)["actor"]["optim"], "actor.optim")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--response", type=int, default=768)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument(
        "--logprob-micro-batch",
        type=int,
        default=None,
        help="actor.logprob_micro_batch_size (default: --micro-batch)",
    )
    parser.add_argument("--steps", type=int, default=2, help="timed train calls per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per actor; figures are their medians")
    parser.add_argument(
        "--recipe",
        default="moonlight-16b-grpo-megatron",
        help="the recipe whose actor.optim the actors train with (precision-aware optimizer included)",
    )
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="H200 bf16 dense")
    parser.add_argument("--backends", default="torch,megatron")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR")
    parser.add_argument(
        "--profile-host", action="store_true", help="with --profile: host ops and sync sources"
    )
    parser.add_argument("--megatron-grouped-gemm", action="store_true", help="actor.model.moe_grouped_gemm")
    parser.add_argument("--megatron-variants", default="", help="comma-separated provider key=value runs")
    parser.add_argument(
        "--megatron-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a provider setting of every TE Megatron actor of this run, e.g. attention_backend=unfused",
    )
    parser.add_argument(
        "--emulate-rank",
        action="store_true",
        help="the Megatron actor as rank 0 of the recipe's layout, collectives left out (docstring)",
    )
    args = parser.parse_args()
    if args.emulate_rank and args.backends != "megatron":
        raise SystemExit("--emulate-rank measures the Megatron actor: --backends megatron (variants allowed)")
    config = json.loads((Path(args.model) / "config.json").read_text())
    ensure_tokenizer(args.model)
    model = ModelConfig(
        model_path=args.model, precision=args.precision, moe_grouped_gemm=args.megatron_grouped_gemm
    )
    if args.emulate_rank:
        model = emulated_model(args.recipe, args.model, args.precision)
    cfg = Config(
        runner=RunnerConfig(seed=1),
        algorithm=AlgorithmConfig(),
        actor=ActorConfig(
            micro_batch_size=args.micro_batch,
            logprob_micro_batch_size=args.logprob_micro_batch,
            global_batch_size=args.rows,  # one optimizer step per train call
            seq_length=args.prompt + args.response,
            model=model,
            optim=recipe_optim(args.recipe),
        ),
    )
    data = batch(config["vocab_size"], args.rows, args.prompt, args.response)
    tokens = args.rows * (args.prompt + args.response)
    flops = tokens * flops_per_token(config, context=args.prompt + args.response)
    settings = {k: v for text in args.megatron_setting for k, v in parse_setting(text).items()}
    emulation = contextlib.nullcontext
    if args.emulate_rank:
        from benchmarks.rank_emulation import EMULATION_SETTINGS, emulate_rank, random_weights
        from benchmarks.rank_prediction import rank_flops_per_token

        tp, ep, etp = (
            model.tensor_model_parallel_size,
            model.expert_model_parallel_size,
            model.expert_tensor_parallel_size,
        )
        emulate_rank(tp, tp=tp, ep=ep, etp=etp)
        flops = tokens * rank_flops_per_token(config, tp, ep, etp, context=args.prompt + args.response)
        settings |= EMULATION_SETTINGS
        emulation = random_weights
    result: dict = {
        "benchmark": "actor_throughput",
        "gpu": torch.cuda.get_device_name(),
        "model": args.model,
        "layers": config["num_hidden_layers"],
        "precision": args.precision,
        "tokens_per_train_call": tokens,
        "micro_batch_size": args.micro_batch,
        "logprob_micro_batch_size": args.logprob_micro_batch or args.micro_batch,
        "megatron_moe_grouped_gemm": args.megatron_grouped_gemm,
        "model_tflop_per_call": flops / 1e12,
        "recipe_optim": args.recipe,
        "use_precision_aware_optimizer": cfg.actor.optim.use_precision_aware_optimizer,
        "repeats": args.repeats,
        "emulated_rank": emulated_layout(model) if args.emulate_rank else None,
    }
    shape = Shape(steps=args.steps, tokens=tokens, flops=flops, peak_tflops=args.peak_tflops)
    # The TE-free child first: this process then holds no GPU memory yet (megatron keeps some after
    # its actor is gone; both together ran out of the H200's 140 GiB on the slice).
    backends = sorted(args.backends.split(","), key=lambda b: b != "megatron-te-free")
    runs_planned = [(b, {}) for b in backends]
    runs_planned += [(f"megatron[{v}]", parse_variant(v)) for v in args.megatron_variants.split(",") if v]
    result["megatron_settings"] = {k: getattr(v, "name", v) for k, v in settings.items()}
    for name, overrides in runs_planned:
        if name == "megatron-te-free":
            result[name] = measure_te_free(sys.argv[1:])
            print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
            continue
        backend = name.split("[")[0]
        actor_overrides = {**settings, **overrides}
        with provider_overrides(actor_overrides), emulation():
            runs, spec = measure(
                backend,
                replace(cfg, actor=with_model_keys(cfg.actor, actor_overrides))
                if backend == "megatron"
                else cfg,
                data,
                shape,
                args.repeats,
                args.profile,
                args.profile_host,
                label=name,
            )
        result[name] = {
            **({"spec": spec["spec"], "routed_experts": spec["routed_experts"]} if spec else {}),
            **median_of_runs(runs),
        }
        # A partial figure survives a run cut off by the device's time limit.
        print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
    if args.emulate_rank:
        for name, overrides in runs_planned:
            key = "prediction" + name.removeprefix("megatron")  # prediction, prediction[variant]
            rows = {k: v for k, v in {**settings, **overrides}.items() if k in BATCH_KEYS}
            result[key] = predicted_step(args, config, result[name], rows)
    print(json.dumps(with_speedups(result)))


def emulated_model(recipe: str, model_path: str, precision: str) -> ModelConfig:
    """The recipe's actor.model (its layout, dispatcher, grouped GEMM, recompute) on `model_path`, a
    folder with the published config.json alone: transformers' own DeepSeek-V3 config reads it, so the
    recipe's trust_remote_code (Moonlight's tokenizer needs it) is off here."""
    from rlinf.config.loader import compose_recipe
    from rlinf.config.typed import from_dict

    model = from_dict(ModelConfig, compose_recipe(recipe)["actor"]["model"], "actor.model")
    return replace(model, model_path=model_path, precision=precision, trust_remote_code=False)


def emulated_layout(model: ModelConfig) -> dict:
    return {
        "ranks": model.tensor_model_parallel_size,
        "tp": model.tensor_model_parallel_size,
        "ep": model.expert_model_parallel_size,
        "etp": model.expert_tensor_parallel_size,
        "sequence_parallel": model.sequence_parallel,
        "routing": "uniform at random (moe_router_force_load_balancing)",
        "weights": "random (megatron-core's init; no checkpoint load)",
    }


def predicted_step(args, config: dict, measured: dict, rows: dict | None = None) -> dict:
    """The recipe's per-GPU actor time per step from the emulated rank's medians (`rows`: the run's
    micro_batch_size / logprob_micro_batch_size where a variant changed them)."""
    from benchmarks.rank_prediction import predict_actor_step
    from rlinf.config import load_config

    rows = rows or {}
    micro_batch = rows.get("micro_batch_size") or args.micro_batch
    logprob_rows = rows.get("logprob_micro_batch_size") or args.logprob_micro_batch or micro_batch

    return predict_actor_step(
        load_config(args.recipe, []),
        config,
        train_call_s=measured["seconds_per_train_call"],
        optimizer_step_s=measured["seconds_per_optimizer_step"],
        logprob_call_s=measured["seconds_per_logprob_call"],
        sequences_per_call=args.rows,
        sequences_per_micro_batch=micro_batch,
        tokens_per_micro_batch=micro_batch * (args.prompt + args.response),
        logprob_sequences_per_micro_batch=logprob_rows,
    )


def with_speedups(result: dict) -> dict:
    """`result` plus each measured Megatron actor's train tokens/s over the HF actor's and its logprob
    pass's speed over HF's (HF's seconds over its own), when both ran (the run's other entries, e.g.
    megatron_settings, are not actors)."""
    hf = result.get("torch")
    actors = [
        n
        for n, v in result.items()
        if n.startswith("megatron") and isinstance(v, dict) and "tokens_per_s" in v
    ]
    if not hf:
        return result
    return {
        **result,
        **{f"{n}_speedup_vs_hf": result[n]["tokens_per_s"] / hf["tokens_per_s"] for n in actors},
        **{
            f"{n}_logprob_speedup_vs_hf": hf["seconds_per_logprob_call"]
            / result[n]["seconds_per_logprob_call"]
            for n in actors
            if "seconds_per_logprob_call" in result[n] and "seconds_per_logprob_call" in hf
        },
    }


if __name__ == "__main__":
    main()
