"""Partial rollout against the plain step on one SGLang engine: does carrying unfinished groups
over (`data.partial_rollout`, rlinf/workers/rollout/partial.py) cut the step's long tail?

Responses get lengths from the mixed-length law of decode_bounds.response_lengths (log-normal,
median a third of the limit, some at the limit), each request decoding exactly its length
(`ignore_eos`). Per step, with the same engine:
- plain: `batch` responses (batch / group_size groups), all run to the end;
- partial: the groups carried from the step before plus fresh groups, `oversample_groups` more
  than the batch in flight, ended once batch / group_size groups are complete through the rollout's
  own path (sglang_engine.generate_until_quota: abort by rid; the abort reply's output is carried,
  partial.finish_step). The first partial step starts with nothing carried, so the steady state
  is the later steps.
Reported per step: seconds, the trained tokens, tokens per second, and what was carried; and over
the steps after the first, trained tokens per second of partial against plain. Prints JSON.
Needs CUDA and sglang.

    python -m benchmarks.partial_rollout_steps --checkpoint DIR [--layers 27] [--batch 256] \
        [--max-new-tokens 2048] [--oversample-groups 8] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.decode_bounds import response_lengths
from benchmarks.rollout_decode import engine_arguments, ensure_checkpoint, random_prompts, start_sglang
from rlinf.data.datasets import PromptItem
from rlinf.workers.rollout.partial import Continuation, GroupInFlight, continuations, finish_step, step_quota
from rlinf.workers.rollout.sglang_args import continuation_piece
from rlinf.workers.rollout.sglang_engine import generate_until_quota


def requests_of(groups: list[GroupInFlight], targets: list[list[int]], limit: int) -> list[Continuation]:
    """The step's requests (partial.continuations), each decoding up to its response's own length."""
    return [
        replace(c, max_new_tokens=targets[c.group][c.response] - c.generated)
        for c in continuations(groups, limit)
    ]


def run_requests(engine, requests: list[Continuation], quota) -> tuple[list, float]:
    params = [{"temperature": 1.0, "max_new_tokens": c.max_new_tokens, "ignore_eos": True} for c in requests]
    start = time.perf_counter()
    replies = engine.loop.run_until_complete(
        generate_until_quota(engine, [c.input_ids for c in requests], params, quota)
    )
    return [continuation_piece(reply, f"request {i}") for i, reply in enumerate(replies)], (
        time.perf_counter() - start
    )


def plain_step(engine, prompts: list[list[int]], lengths: list[int]) -> dict:
    """Every response to its length, no quota: the step as rlinf runs it without over-sampling."""
    from rlinf.workers.rollout.group_quota import GroupQuota

    requests = [Continuation(i, 0, p, 0, n) for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))]
    quota = GroupQuota(list(range(len(requests))), keep=len(requests))
    pieces, seconds = run_requests(engine, requests, quota)
    tokens = sum(len(p.token_ids) for p in pieces)
    if tokens != sum(lengths):
        raise RuntimeError(f"plain step: {tokens} tokens of {sum(lengths)}")
    return {
        "seconds": round(seconds, 3),
        "trained_tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 1),
    }


def partial_step(engine, groups, targets, keep: int, limit: int) -> tuple[dict, list, list]:
    requests = requests_of(groups, targets, limit)
    quota = step_quota(groups, requests, keep)
    pieces, seconds = run_requests(engine, requests, quota)
    result = finish_step(groups, requests, pieces, quota, pad_id=0, decode=lambda ids: "")
    kept = set(quota.kept_groups())
    carried_targets = [t for g, t in enumerate(targets) if g not in kept]
    trained = result.batch.num_response_tokens
    aborted = sum(p.finish_reason == "abort" for p in pieces)
    row = {
        "seconds": round(seconds, 3),
        "requests": len(requests),
        "aborted_requests": aborted,
        "aborted_with_output": sum(p.finish_reason == "abort" and len(p.token_ids) > 0 for p in pieces),
        "trained_responses": len(result.batch),
        "trained_tokens": trained,
        "generated_tokens": sum(len(p.token_ids) for p in pieces),
        "tokens_per_s": round(trained / seconds, 1),
        **result.metrics(),
    }
    return row, result.carried, carried_targets


def run_steps(engine, args, vocab: int) -> list[dict]:
    """The plain step and the partial step, `args.steps` times on one engine (rows per step)."""
    size, keep = args.group_size, args.batch // args.group_size
    in_flight = keep + args.oversample_groups
    rows: list[dict] = []
    carried: list[GroupInFlight] = []
    carried_targets: list[list[int]] = []
    plain_step(engine, random_prompts(size, args.prompt_len, vocab, seed=0), [4] * size)  # warm-up
    for step in range(args.steps):
        prompts = random_prompts(args.batch, args.prompt_len, vocab, seed=100 + step)
        plain = plain_step(engine, prompts, response_lengths(args.batch, args.max_new_tokens, seed=step))
        count = in_flight - len(carried)
        fresh_prompts = random_prompts(count, args.prompt_len, vocab, seed=200 + step)
        lengths = response_lengths(count * size, args.max_new_tokens, seed=300 + step)
        fresh = [
            GroupInFlight.fresh(PromptItem(tuple(p), "", ("",), "benchmark"), size) for p in fresh_prompts
        ]
        targets = carried_targets + [lengths[g * size : (g + 1) * size] for g in range(count)]
        partial, carried, carried_targets = partial_step(
            engine, carried + fresh, targets, keep, args.max_new_tokens
        )
        rows.append({"step": step + 1, "plain": plain, "partial": partial})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    """Trained tokens per second over the steps after the first (the first carries nothing in)."""
    steady = rows[1:] or rows

    def rate(kind: str) -> float:
        return sum(r[kind]["trained_tokens"] for r in steady) / sum(r[kind]["seconds"] for r in steady)

    return {
        "steady_steps": len(steady),
        "plain_trained_tokens_per_s": round(rate("plain"), 1),
        "partial_trained_tokens_per_s": round(rate("partial"), 1),
        "partial_vs_plain": round(rate("partial") / rate("plain"), 4),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=27, help="layers of the checkpoint built when missing")
    parser.add_argument("--batch", type=int, default=256, help="responses trained per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--oversample-groups", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=2048)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--sglang-mem-fraction", type=float, default=0.7)
    args = parser.parse_args(argv)
    if args.batch % args.group_size:
        parser.error(f"--batch {args.batch} is not a multiple of --group-size {args.group_size}")
    # what rollout_decode.engine_arguments reads: the largest batch in flight, triton prefill
    args.batches = str(args.batch + args.oversample_groups * args.group_size)
    args.sglang_attention, args.sglang_arg = "triton", []
    return args


def main() -> None:
    args = parse_args()
    ensure_checkpoint(args.checkpoint, args.layers)
    hf_config = json.loads((args.checkpoint / "config.json").read_text())
    kwargs, env = engine_arguments(args.checkpoint, hf_config, args, {}, {})
    os.environ.update({k: v for k, v in env.items() if v is not None})  # the engine's processes inherit it
    engine = start_sglang(kwargs)
    try:
        rows = run_steps(engine, args, hf_config["vocab_size"])
    finally:
        engine.shutdown()
    head = {"benchmark": "partial_rollout_steps", "layers": hf_config["num_hidden_layers"]}
    shape = {k: getattr(args, k) for k in ("batch", "group_size", "oversample_groups", "max_new_tokens")}
    print(json.dumps({**head, **shape, "steps": rows, **summary(rows)}))


if __name__ == "__main__":
    main()
