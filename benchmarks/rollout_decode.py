"""Rollout decode throughput on the Moonlight slice: the torch rollout's `sample`, transformers'
`generate` and (when importable) SGLang, against the weight-bandwidth bound, all in one run.

Every backend decodes exactly --new-tokens tokens per row (EOS masked / ignored) after prompts of
exactly --prompt-len random tokens, temperature 1, no truncation; tokens/s counts generated tokens
over the whole call (prefill included). Each backend also times the same batch with one new token
(the prefill and first token alone), so decode_tokens_per_s = batch x (new tokens - 1) / (whole
call - that call): the decode steps alone, as SGLang's bench_one_batch separates prefill from
decode. Two bounds, both at the device-copy bandwidth measured here (read + write bytes of a 4 GiB
device-to-device copy) and both of decode steps: every weight byte a step reads (all but the input
embedding table) -> decode_fraction_of_bound; those plus the MLA KV cache of the batch at the
decode's average context -> decode_fraction_of_kv_bound (benchmarks/decode_bounds.py). Prints one
JSON object; --rows FILE also appends each row as a JSON line as soon as it is measured.

    python -m benchmarks.rollout_decode [--batches 64,256] [--new-tokens 512] [--backends torch,generate]
        [--breakdown]  # also ms per decode forward for each experts implementation, and per sampling step
        [--backends sglang --checkpoint DIR]  # SGLang alone (needs the slice on disk; built if missing)
        [--sglang-profile DIR]  # then a GPU trace of PROFILE_STEPS decode steps at each batch
                                # on the rollout's own engine (not the variants), summarised (busy /
                                # idle / top kernels per step, trace_summary.py)
        [--sglang-variants JSON]  # more engines after the base one, e.g. our MoE tables, FlashMLA decode,
                                  # rlinf's lighter sampler: {"hooks": {"env": {"RLINF_SGLANG_HOOKS": 1}}}
        [--sglang-repeats 3]      # timed calls per batch and engine; the median is reported
        [--tail-lengths 2048,4096]  # SGLang: instead of the fixed-length batches, per length one
                                  # fixed-length call and one of mixed lengths (decode_bounds.
                                  # response_lengths) timed per request: the tail of the step
        [--oversample-groups 4]   # with --tail-lengths: also the same batch plus this many groups,
                                  # ended by data.oversample_prompts' quota (rollout's abort path)
        [--time-budget-s 500]     # start no engine that would likely end past this; report the rest
        [--sdpa-backends flash,efficient,math]  # torch / generate: the SDPA kernels allowed (default:
                                  # torch's choice, cuDNN first on Hopper; the torch rollout's decode
                                  # leaves cuDNN out itself, sampling.decode_attention_kernels); one
                                  # setting per process, as the first long decode of a process runs
                                  # slower (docs/benchmarks.md)

SGLang is warmed up at each measured batch shape first (a new shape compiles triton kernels).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks._common import device_copy_bandwidth, emit, environment, gib, slice_model, timed, weight_bytes
from benchmarks.decode_bounds import decode_bounds, kv_bytes_per_token, response_lengths, tail_report
from rlinf.workers.rollout.sampling import SamplingParams, choose_next_tokens, sample

PROFILE_STEPS = 24
ROWS: Path | None = None  # --rows
PROCESS_START = time.perf_counter()
EOS = 163586  # Moonlight's; masked by min_new_tokens everywhere, so rows never stop early
DEVICE = "cuda"  # --smoke: "cpu", with a small random model, to check the script itself


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 256, (batch, length), generator=generator).tolist()


def run_torch(model, prompts, new_tokens: int, sampler=None) -> float:
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    sample_fn = sample if sampler is None else sampler.sample
    seconds, out = timed(
        lambda: sample_fn(
            model,
            prompts,
            params,
            eos_token_ids=[EOS],
            pad_token_id=0,
            generator=generator,
            max_batch_size=len(prompts),
        )
    )
    assert int(out.response_mask.sum()) == len(prompts) * new_tokens
    return seconds


def run_generate(model, prompts, new_tokens: int) -> float:
    input_ids = torch.tensor(prompts, device=DEVICE)

    def call():
        with torch.inference_mode():
            return model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
                eos_token_id=EOS,
            )

    seconds, out = timed(call)
    assert out.shape[1] == input_ids.shape[1] + new_tokens
    return seconds


def run_sglang(prompts, new_tokens: int, engine) -> float:
    # ignore_eos, not min_new_tokens: SGLang's min_new_tokens penalizer reads the request's tokenizer,
    # which skip_tokenizer_init leaves unset (see rlinf/workers/rollout/sglang_args.py).
    params = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}
    seconds, outs = timed(
        lambda: engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
    )
    assert all(len(o["output_ids"]) == new_tokens for o in outs)
    return seconds


def run_sglang_per_request(prompts, lengths: list[int], engine) -> tuple[list[float], float]:
    """Every prompt as its own request, submitted together (one batch, as the rollout's), each with
    its own max_new_tokens: (seconds from submission to each request's end, whole call)."""
    import asyncio
    import time

    start = time.perf_counter()

    async def one(prompt, length):
        params = {"temperature": 1.0, "max_new_tokens": length, "ignore_eos": True}
        out = await engine.async_generate(input_ids=prompt, sampling_params=params, return_logprob=True)
        assert len(out["output_ids"]) == length
        return time.perf_counter() - start

    async def batch():
        return await asyncio.gather(*(one(p, n) for p, n in zip(prompts, lengths, strict=True)))

    finishes = engine.loop.run_until_complete(batch())
    return list(finishes), time.perf_counter() - start


def run_in_process(backend: str, model, prompts, args, entry: dict, compare) -> None:
    """One in-process backend at one batch: a small warm-up, the one-new-token call, the whole call."""
    if backend in ("torch", "torch_compare"):
        sampler = compare if backend == "torch_compare" else None
        run_torch(model, prompts[:8], 4, sampler)  # warm-up (kernels, allocator)
        prefill = run_torch(model, prompts, 1, sampler)
        seconds = run_torch(model, prompts, args.new_tokens, sampler)
    else:
        run_generate(model, prompts[:8], 4)
        prefill = run_generate(model, prompts, 1)
        seconds = run_generate(model, prompts, args.new_tokens)
    extra = {"sampler": args.compare_sampler} if backend == "torch_compare" else {}
    add_run(entry, backend, args.new_tokens, seconds, prefill, **extra)


SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
    "cudnn": "CUDNN_ATTENTION",
}


def sdpa_backends(names: str | None):
    """A context-manager factory: torch's `sdpa_kernel` over the named kernels, or a no-op for None."""
    import contextlib

    if not names:
        return contextlib.nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    unknown = [n for n in names.split(",") if n not in SDPA_BACKENDS]
    if unknown:
        raise SystemExit(f"--sdpa-backends: unknown {unknown}; choose from {sorted(SDPA_BACKENDS)}")
    chosen = [getattr(SDPBackend, SDPA_BACKENDS[n]) for n in names.split(",")]
    return lambda: sdpa_kernel(chosen)


def decode_breakdown(model, batch: int, prompt_len: int, steps: int = 16) -> dict[str, float]:
    """ms per decode forward (after a prefill) for each experts implementation, and per sampling step."""
    from transformers import DynamicCache

    result: dict[str, float] = {}
    ids = torch.tensor(random_prompts(batch, prompt_len, model.config.vocab_size, 3), device=DEVICE)
    original = model.get_experts_implementation()
    with torch.inference_mode():
        for experts in ("grouped_mm", "batched_mm"):
            model.set_experts_implementation("grouped_mm")  # batched_mm on a prefill: TBs of gathers
            cache = DynamicCache(config=model.config)
            mask = torch.ones(batch, prompt_len + steps + 2, dtype=torch.bool, device=DEVICE)
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            model.set_experts_implementation(experts)
            token = ids[:, -1:]

            def step(i: int, token=token, mask=mask, cache=cache) -> None:
                model(
                    input_ids=token,
                    attention_mask=mask[:, : prompt_len + i + 1],
                    position_ids=torch.full((batch, 1), prompt_len + i, device=DEVICE),
                    past_key_values=cache,
                    use_cache=True,
                )

            step(0)
            seconds, _ = timed(lambda: [step(i) for i in range(1, steps + 1)])
            result[f"forward_ms_{experts}"] = round(1e3 * seconds / steps, 2)
        model.set_experts_implementation(original)
        logits = torch.randn(batch, model.config.vocab_size, device=DEVICE, dtype=torch.bfloat16)
        params = SamplingParams(temperature=1.0)
        generator = torch.Generator(device=DEVICE).manual_seed(0)
        choose_next_tokens(logits, params, generator=generator)
        seconds, _ = timed(
            lambda: [choose_next_tokens(logits, params, generator=generator) for _ in range(steps)]
        )
        result["sampling_step_ms"] = round(1e3 * seconds / steps, 3)
    return result


def profile_torch(model, prompts) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    run_torch(model, prompts, 4)
    with profile(activities=activities) as prof:
        run_torch(model, prompts, 16)
    sort = "cuda_time_total" if DEVICE == "cuda" else "cpu_time_total"
    print(f"profile batch {len(prompts)}:", file=sys.stderr)
    print(prof.key_averages().table(sort_by=sort, row_limit=18, max_name_column_width=60), file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--backends", default="torch,generate", help="comma list of torch, generate, sglang")
    parser.add_argument(
        "--compare-sampler",
        default=None,
        help="module path of another sampling module (e.g. an older sampling.py) timed as backend torch_compare",
    )
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="torch.profiler table (top CUDA ops) of 16 torch-rollout steps, stderr",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="CPU, small random model: checks the script only"
    )
    parser.add_argument("--checkpoint", default="/tmp/rlinf-bench/moonlight-slice-4l", help="for sglang")
    parser.add_argument("--sglang-mem-fraction", type=float, default=0.5)
    parser.add_argument(
        "--sglang-attention", default="triton", help="rollout.sglang.attention_backend of every engine"
    )
    parser.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an Engine argument, e.g. attention_backend=flashinfer, sampling_backend=flashinfer",
    )
    parser.add_argument("--sglang-profile", type=Path, default=None, metavar="DIR")
    parser.add_argument(
        "--sglang-repeats", type=int, default=3, help="timed calls per batch; median reported"
    )
    parser.add_argument(
        "--sglang-variants",
        default="{}",
        metavar="JSON",
        help="more engines measured after the base one (the rollout's engine: sglang_settings.engine_settings), "
        'in the same run: {"name": {engine kwargs..., "env": {VAR: value or null to unset}}}, e.g. '
        '{"generic_moe": {"env": {"SGLANG_MOE_CONFIG_DIR": null}}}',
    )
    parser.add_argument("--tail-lengths", default="", help="comma list of max new tokens (SGLang)")
    parser.add_argument("--tail-share", type=float, default=0.9)
    parser.add_argument("--group-size", type=int, default=8, help="GRPO group of the tail report")
    parser.add_argument(
        "--oversample-groups",
        type=int,
        default=0,
        help="tail runs: also draw this many more groups and end at the batch's groups (the rollout's "
        "quota path, data.oversample_prompts)",
    )
    parser.add_argument("--time-budget-s", type=float, default=0.0, help="0 = no budget")
    parser.add_argument("--rows", type=Path, default=None, help="append every row here as a JSON line")
    parser.add_argument(
        "--sdpa-backends",
        default=None,
        help="comma list of flash, efficient, math, cudnn: the only SDPA kernels the torch and generate runs "
        "may use (the torch rollout's decode also leaves cuDNN out on CUDA)",
    )
    args = parser.parse_args()
    global ROWS
    ROWS = args.rows

    batches = [int(b) for b in args.batches.split(",")]
    backends = args.backends.split(",")
    variants = {"sglang": {}, **{f"sglang:{k}": v for k, v in parse_variants(args.sglang_variants).items()}}
    compare = None
    if args.compare_sampler:
        import importlib

        compare = importlib.import_module(args.compare_sampler)
        backends.insert(backends.index("torch") + 1, "torch_compare")
    global DEVICE, EOS
    if args.smoke:
        DEVICE, EOS = "cpu", 1
    bandwidth = device_copy_bandwidth() if DEVICE == "cuda" else 1e10
    result: dict = {
        "hardware": environment(),
        "device_copy_bandwidth_GBps": round(bandwidth / 1e9, 1),
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "layers": args.layers,
        "tail_lengths": args.tail_lengths or None,
        "sdpa_backends": args.sdpa_backends or "torch default",
        "runs": [],
    }
    in_process_attention = sdpa_backends(args.sdpa_backends)

    model = slice_model(args.layers) if {"torch", "generate"} & set(backends) and not args.smoke else None
    if args.smoke:
        from rlinf.models.tiny import SMALL_SETTINGS, random_deepseek_v3

        model = random_deepseek_v3(SMALL_SETTINGS, vocab_size=512, eos_token_id=EOS)
    if model is not None:
        nbytes = weight_bytes(model)
        read_bytes = nbytes - weight_bytes(model.get_input_embeddings())
        hf_config = model.config.to_dict()
    else:
        from rlinf.models.slice import moonlight_slice_config

        hf_config = moonlight_slice_config(args.layers)
    vocab = hf_config["vocab_size"]
    if "sglang" in backends:
        ensure_checkpoint(Path(args.checkpoint), args.layers)
        hf_config = json.loads((Path(args.checkpoint) / "config.json").read_text())
        if model is None:
            tensors = checkpoint_tensor_bytes(Path(args.checkpoint))
            nbytes = sum(tensors.values())
            read_bytes = nbytes - tensors.get("model.embed_tokens.weight", 0)
    result["layers"] = hf_config["num_hidden_layers"]
    result["weight_GiB"] = gib(nbytes)
    result["weight_read_per_step_GiB"] = gib(read_bytes)
    kv_token = kv_bytes_per_token(hf_config)
    result["kv_cache_bytes_per_token"] = kv_token
    in_process = [b for b in backends if b != "sglang"]

    entries = {}
    for batch in batches:
        prompts = random_prompts(batch, args.prompt_len, vocab, seed=batch)
        bounds = decode_bounds(batch, args.prompt_len, args.new_tokens, read_bytes, kv_token, bandwidth)
        entries[batch] = entry = {"batch": batch, **bounds}
        entry["backends"] = []
        for backend in in_process:
            with in_process_attention():
                run_in_process(backend, model, prompts, args, entry, compare)
        if args.breakdown and model is not None:
            entry["breakdown"] = decode_breakdown(model, batch, args.prompt_len)
        if args.profile and model is not None:
            profile_torch(model, prompts)
        result["runs"].append(entry)
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if "sglang" in backends:
        # Last, with the in-process model gone: an SGLang engine up in the same process shares the
        # GPU and host with the torch rollout and slows it several times.
        del model
        gc.collect()
        torch.cuda.empty_cache()
        tail = {"lengths": [int(n) for n in args.tail_lengths.split(",") if n], "read": read_bytes}
        tail.update(kv_token=kv_token, bandwidth=bandwidth)
        longest = 0.0
        for name, variant in variants.items():
            elapsed = time.perf_counter() - PROCESS_START  # --time-budget-s counts from the start
            if args.time_budget_s and elapsed + 1.1 * longest > args.time_budget_s:
                result.setdefault("sglang_variants_not_run", []).append(name)  # the call's time is up
                continue
            variant_started = time.perf_counter()
            try:
                profile = measure_sglang(name, variant, entries, batches, hf_config, args, tail, result)
            except VariantUnavailable as exc:
                result.setdefault("sglang_variant_unavailable", {})[name] = str(exc)
                print({name: str(exc)}, file=sys.stderr, flush=True)
                continue
            except Exception as exc:  # a variant the installed SGLang cannot run: say so, go on
                result.setdefault("sglang_variant_errors", {})[name] = f"{type(exc).__name__}: {exc}"[:2000]
                print({name: result["sglang_variant_errors"][name]}, file=sys.stderr, flush=True)
                continue
            finally:
                longest = max(longest, time.perf_counter() - variant_started)
            if profile:
                result.setdefault("sglang_decode_profile", {})[name] = profile
    emit(result)


class VariantUnavailable(RuntimeError):
    """A variant this machine cannot run (a kernel the installed sglang-kernel lacks)."""


def measure_sglang(
    name: str,
    variant: dict,
    entries: dict,
    batches: list[int],
    hf_config: dict,
    args,
    tail: dict,
    result: dict,
) -> dict | None:
    """One engine (the rollout's engine for this checkpoint + the variant's arguments, under the
    variant's environment), every batch (or the tail runs), then the optional decode profile; the
    engine is shut down before the next variant."""
    variant = dict(variant)
    env_changes = variant.pop("env", {})
    kwargs, env = engine_arguments(Path(args.checkpoint), hf_config, args, variant, env_changes)
    from rlinf.workers.rollout.sglang_settings import flashmla_kernel, uses_flashmla

    if uses_flashmla(kwargs) and flashmla_kernel() is None:
        raise VariantUnavailable("FlashMLA: the installed sglang-kernel has no sgl_kernel/flashmla_ops*.so")
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():  # the engine's processes inherit it at start
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        engine = start_sglang(kwargs)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    extra = {"variant": variant, "env": env_changes} if variant or env_changes else {}
    vocab = hf_config["vocab_size"]
    try:
        if tail["lengths"]:
            for batch in batches:
                measure_tail(name, engine, batch, vocab, args, tail, result, extra)
            return None
        for batch in batches:
            prompts = random_prompts(batch, args.prompt_len, vocab, seed=batch)
            # Warm-up at the measured batch shape: the first prefill and decode of a shape compile
            # triton kernels, which would otherwise count in the first engine's figures.
            run_sglang(prompts, 4, engine)
            # Repeats, median reported: single measurements of one engine scatter by up to 2x.
            times = sorted(run_sglang(prompts, args.new_tokens, engine) for _ in range(args.sglang_repeats))
            prefills = sorted(run_sglang(prompts, 1, engine) for _ in range(args.sglang_repeats))
            timings = {"all_seconds": [round(t, 3) for t in times]}
            timings["all_prefill_seconds"] = [round(t, 3) for t in prefills]
            add_run(
                entries[batch], name, args.new_tokens, median(times), median(prefills), **extra, **timings
            )
        if args.sglang_profile and name == "sglang":  # the rollout's own engine: where the time goes
            return {
                f"batch_{batch}": profile_sglang_decode(
                    engine,
                    random_prompts(batch, args.prompt_len, vocab, seed=7),
                    args.sglang_profile / f"{name}-batch{batch}",
                )
                for batch in batches
            }
        return None
    finally:
        engine.shutdown()


def measure_tail(
    name: str, engine, batch: int, vocab: int, args, tail: dict, result: dict, extra: dict
) -> None:
    """Per length: one call of exactly that many new tokens (decode rate against both bounds), and
    one of mixed lengths up to it, timed per request (the tail of the step)."""
    prompts = random_prompts(batch, args.prompt_len, vocab, seed=batch)
    run_sglang(prompts, 4, engine)  # warm-up at this batch shape
    prefill = run_sglang(prompts, 1, engine)
    for length in tail["lengths"]:
        bounds = decode_bounds(
            batch, args.prompt_len, length, tail["read"], tail["kv_token"], tail["bandwidth"]
        )
        entry = {"batch": batch, "new_tokens": length, **bounds, "backends": []}
        add_run(entry, name, length, run_sglang(prompts, length, engine), prefill, **extra)
        lengths = response_lengths(batch, length, seed=batch)
        finishes, seconds = run_sglang_per_request(prompts, lengths, engine)
        report = tail_report(finishes, lengths, args.group_size, args.tail_share)
        row = {
            "backend": name,
            "batch": batch,
            "max_new_tokens": length,
            "prefill_seconds": round(prefill, 3),
        }
        row.update(report, call_seconds=round(seconds, 3), **extra)
        if args.oversample_groups:
            row["oversampled"] = measure_oversampled(engine, batch, length, vocab, args, report)
        entry["tail"] = row
        result.setdefault("tail_runs", []).append(entry)
        write_row({"tail": row})
        print({"tail": row}, file=sys.stderr, flush=True)


def measure_oversampled(engine, batch: int, length: int, vocab: int, args, plain: dict) -> dict:
    """The mixed-length batch plus `oversample_groups` groups drawn from the same length law (the
    first `batch` lengths are the plain run's), ended once batch / group_size groups are complete
    through the rollout's own quota path (sglang_engine.generate_until_quota: abort by rid)."""
    import time

    from rlinf.workers.rollout.group_quota import GroupQuota
    from rlinf.workers.rollout.sglang_engine import generate_until_quota

    size = args.group_size
    count = batch + args.oversample_groups * size
    prompts = random_prompts(count, args.prompt_len, vocab, seed=batch)
    lengths = response_lengths(count, length, seed=batch)
    params = [{"temperature": 1.0, "max_new_tokens": n, "ignore_eos": True} for n in lengths]
    quota = GroupQuota([row // size for row in range(count)], keep=batch // size)
    start = time.perf_counter()
    replies = engine.loop.run_until_complete(generate_until_quota(engine, prompts, params, quota))
    seconds = time.perf_counter() - start
    kept = quota.kept_rows()
    if any(replies[row] is None or len(replies[row]["output_ids"]) != lengths[row] for row in kept):
        raise RuntimeError("a kept response is missing or cut short")
    kept_tokens = sum(lengths[row] for row in kept)
    return {
        "requests": count,
        "kept_groups": batch // size,
        "aborted_requests": sum(reply is None for reply in replies),
        "step_seconds": round(seconds, 3),
        "kept_tokens": kept_tokens,
        "kept_tokens_per_s": round(kept_tokens / seconds, 1),
        "step_vs_plain": round(seconds / plain["step_seconds"], 4),
        "kept_tokens_per_s_vs_plain": round(kept_tokens / seconds / plain["tokens_per_s"], 4),
    }


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def add_run(
    entry: dict, backend: str, new_tokens: int, seconds: float, prefill_seconds: float, **extra
) -> None:
    """One backend's row: the whole call (`seconds`, prefill included) and its decode steps alone
    (`seconds` minus a one-new-token call of the same batch, `prefill_seconds`)."""
    batch, bound = entry["batch"], entry["bound_tokens_per_s"]
    run = {
        "backend": backend,
        "batch": batch,
        "new_tokens": new_tokens,
        "seconds": round(seconds, 3),
        **extra,
    }
    run["tokens_per_s"] = round(batch * new_tokens / seconds, 1)
    run["fraction_of_bound"] = round(batch * new_tokens / seconds / bound, 4)
    run["prefill_seconds"] = round(prefill_seconds, 3)
    decode_seconds = seconds - prefill_seconds
    if new_tokens > 1 and decode_seconds > 0:
        decode_rate = batch * (new_tokens - 1) / decode_seconds
        run["decode_tokens_per_s"] = round(decode_rate, 1)
        run["decode_fraction_of_bound"] = round(decode_rate / bound, 4)
        if "kv_bound_tokens_per_s" in entry:
            run["decode_fraction_of_kv_bound"] = round(decode_rate / entry["kv_bound_tokens_per_s"], 4)
        run["decode_step_ms"] = round(1e3 * decode_seconds / (new_tokens - 1), 3)
    entry["backends"].append(run)
    write_row(run)
    print(run, file=sys.stderr, flush=True)


def write_row(row: dict) -> None:
    """--rows: every row on disk as soon as it is measured (a call cut short keeps what it had)."""
    if ROWS is not None:
        ROWS.parent.mkdir(parents=True, exist_ok=True)
        with ROWS.open("a") as f:
            f.write(json.dumps(row) + "\n")


def profile_sglang_decode(engine, prompts, out_dir: Path) -> dict:
    """GPU-only torch-profiler trace of the first PROFILE_STEPS decode steps of one batch (SGLang's
    profile_by_stage), summarised per step: how much of a step the GPU is busy, and with what."""
    from benchmarks.trace_summary import load_events, summarize

    out_dir.mkdir(parents=True, exist_ok=True)
    engine.start_profile(
        output_dir=str(out_dir),
        num_steps=PROFILE_STEPS,
        activities=["GPU"],  # no CPU ops: the host side runs at its unprofiled speed
        profile_by_stage=True,
        with_stack=False,
        record_shapes=False,
    )
    run_sglang(prompts, PROFILE_STEPS + 8, engine)  # steps past the target stop and write the trace
    traces = sorted(out_dir.glob("*DECODE.trace.json*"), key=lambda f: f.stat().st_mtime)
    if not traces:
        return {"error": f"no DECODE trace written to {out_dir}"}
    summary = summarize(load_events(traces[-1]), steps=PROFILE_STEPS)
    summary.update(batch=len(prompts), trace=str(traces[-1]))
    print({"sglang_decode_profile": summary}, file=sys.stderr, flush=True)
    return summary


def ensure_checkpoint(checkpoint: Path, layers: int) -> None:
    if not (checkpoint / "config.json").is_file():
        from rlinf.models.slice import build_moonlight_slice

        build_moonlight_slice(checkpoint, layers, dtype="bf16", device=DEVICE)


def checkpoint_tensor_bytes(checkpoint: Path) -> dict[str, int]:
    """Bytes of each tensor in the checkpoint's safetensors files (from their headers)."""
    from safetensors import safe_open

    sizes = {}
    for file in checkpoint.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                t = f.get_slice(name)
                count = 1
                for d in t.get_shape():
                    count *= d
                sizes[name] = count * {"BF16": 2, "F16": 2, "F32": 4}.get(t.get_dtype(), 2)
    return sizes


def parse_variants(text: str) -> dict[str, dict]:
    """--sglang-variants: a JSON object of name -> object of engine kwargs (and "env")."""
    try:
        variants = json.loads(text)
    except ValueError as err:
        raise SystemExit(f"--sglang-variants: not JSON ({err})") from None
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise SystemExit('--sglang-variants: expected {"name": {engine kwargs..., "env": {...}}, ...}')
    return variants


def parse_engine_args(pairs: list[str]) -> dict:
    """KEY=VALUE strings -> Engine kwargs; values read as JSON where they parse (numbers, booleans)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--sglang-arg {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def benchmark_config(args):
    """The recipe of a one-GPU rollout at the benchmark's shape: the attention backend asked for,
    CUDA graphs and running requests up to the largest batch, --sglang-mem-fraction."""
    from dataclasses import replace

    from rlinf.config.schema import Config

    cfg = Config()
    max_batch = max(int(b) for b in args.batches.split(","))
    sglang = replace(
        cfg.rollout.sglang,
        attention_backend=args.sglang_attention,
        cuda_graph_max_bs=max_batch,
        max_running_requests=max_batch,
    )
    rollout = replace(
        cfg.rollout, tensor_parallel_size=1, gpu_memory_utilization=args.sglang_mem_fraction, sglang=sglang
    )
    return replace(cfg, rollout=rollout)


def engine_arguments(
    checkpoint: Path, hf_config: dict, args, variant: dict, env_changes: dict
) -> tuple[dict, dict]:
    """(Engine kwargs, environment) of one engine: what the rollout worker would start for this
    checkpoint (sglang_settings.engine_settings, measured choices included), then --sglang-arg,
    then the variant's arguments; the variant's env entries replace (null: unset) the rollout's."""
    from rlinf.workers.rollout.sglang_settings import engine_settings

    settings = engine_settings(
        benchmark_config(args), model_path=str(checkpoint), hf_config=hf_config, colocated=False
    )
    kwargs = {**settings.kwargs, **parse_engine_args(args.sglang_arg), **variant}
    env = {**settings.env, **{k: None if v is None else str(v) for k, v in env_changes.items()}}
    return kwargs, env


def start_sglang(kwargs: dict):
    """sglang.Engine with rlinf's sampler plugin discoverable (it acts where RLINF_SGLANG_HOOKS=1)."""
    import sglang

    from rlinf.workers.rollout.sglang_hooks import make_discoverable

    make_discoverable()
    print({"sglang_engine_args": kwargs}, file=sys.stderr, flush=True)
    return sglang.Engine(**kwargs)


if __name__ == "__main__":
    main()
