"""Actor forward+backward throughput on the Moonlight slice: the torch actor's loss path
(rlinf.models.logprobs.response_logprobs, chunked vocabulary projection) against transformers'
default model (forward with labels: full [tokens, vocab] logits and its own cross-entropy) and the
unchunked logprob definition, all in one run. MFU counts matmul FLOPs (benchmarks/_common.py:
forward_flops_per_token, x3 for forward + backward) against the H200's dense bf16 peak.
Megatron's figures come from benchmarks/actor_throughput.py (the Megatron helper's).

    python -m benchmarks.actor_torch_throughput [--tokens 8192,16384] [--seq-len 1024] [--prompt-len 256]
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks._common import emit, environment, forward_flops_per_token, gib, mfu, slice_model, timed
from rlinf.models.logprobs import reference_response_logprobs, response_logprobs


def micro_batch(rows: int, seq_len: int, prompt_len: int, vocab: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq_len), generator=generator).cuda()
    prompt_ids, response_ids = ids[:, :prompt_len], ids[:, prompt_len:]
    prompt_mask = torch.ones_like(prompt_ids, dtype=torch.bool)
    response_mask = torch.ones_like(response_ids, dtype=torch.bool)
    return prompt_ids, prompt_mask, response_ids, response_mask


def step_torch_actor(model, batch, chunked: bool) -> torch.Tensor:
    fn = response_logprobs if chunked else reference_response_logprobs
    kwargs = {"with_entropy": True} if chunked else {}
    logprobs, entropy = fn(model, *batch, temperature=1.0, **kwargs)
    # The policy loss is a per-token function of the logprobs; its own cost is negligible here.
    loss = -(logprobs * batch[3]).sum() / batch[3].sum()
    loss.backward()
    return logprobs.detach()


def step_hf_default(model, batch) -> None:
    prompt_ids, prompt_mask, response_ids, response_mask = batch
    input_ids = torch.cat([prompt_ids, response_ids], 1)
    labels = input_ids.masked_fill(torch.cat([torch.zeros_like(prompt_mask), response_mask], 1) == 0, -100)
    out = model(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels, use_cache=False
    )
    out.loss.backward()


def measure(model, fn, repeats: int) -> tuple[float, int]:
    fn()  # warm-up
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    best = float("inf")
    for _ in range(repeats):
        seconds, _ = timed(fn)
        best = min(best, seconds)
        model.zero_grad(set_to_none=True)
    return best, torch.cuda.max_memory_allocated()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8192,16384", help="tokens per micro-batch")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-unchunked", action="store_true")
    args = parser.parse_args()

    model = slice_model(args.layers).train()
    config = model.config
    # Average attended context of a causal sequence: about half its length.
    flops = 3 * forward_flops_per_token(config, args.seq_len // 2)
    result: dict = {
        "hardware": environment(),
        "experts_implementation": config._experts_implementation,
        "attention_implementation": config._attn_implementation,
        "seq_len": args.seq_len,
        "prompt_len": args.prompt_len,
        "train_flops_per_token": flops,
        "runs": [],
    }
    for tokens in (int(t) for t in args.tokens.split(",")):
        rows = tokens // args.seq_len
        batch = micro_batch(rows, args.seq_len, args.prompt_len, config.vocab_size, seed=tokens)
        entry: dict = {"tokens": rows * args.seq_len, "rows": rows}
        variants = {
            "torch_actor_chunked": lambda b=batch: step_torch_actor(model, b, chunked=True),
            "hf_default_labels_loss": lambda b=batch: step_hf_default(model, b),
        }
        if not args.skip_unchunked:
            variants["torch_actor_unchunked"] = lambda b=batch: step_torch_actor(model, b, chunked=False)
        for name, fn in variants.items():
            try:
                seconds, peak = measure(model, fn, args.repeats)
            except torch.OutOfMemoryError:
                entry[name] = {"error": "CUDA out of memory"}
                model.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                continue
            # Every token of the sequence goes through forward and backward, prompt included.
            tokens_per_s = rows * args.seq_len / seconds
            entry[name] = {
                "seconds": round(seconds, 4),
                "tokens_per_s": round(tokens_per_s, 1),
                "mfu": round(mfu(tokens_per_s, flops), 4),
                "peak_memory_GiB": gib(peak),
            }
            print(name, entry[name], file=sys.stderr, flush=True)
        # Chunked and unchunked logprobs on the same weights and batch (no grad): the equality check.
        with torch.no_grad():
            chunked, _ = response_logprobs(model, *batch)
            unchunked, _ = reference_response_logprobs(model, *batch)
        entry["chunked_vs_unchunked_max_abs_diff"] = float((chunked - unchunked).abs().max())
        result["runs"].append(entry)
        torch.cuda.empty_cache()
    emit(result)


if __name__ == "__main__":
    main()
