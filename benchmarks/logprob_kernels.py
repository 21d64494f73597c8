"""The Megatron actor's vocabulary-parallel logprobs + entropy, forward and backward, on the GPU:
the Triton kernels (rlinf.models.megatron.logprobs_triton) against the chunked torch path of the
same module, at Moonlight's vocabulary, bf16 logits. Prints one JSON object: each path's
milliseconds (best of --repeats, CUDA events), the kernels' HBM bound (one read of the logits
forward, one read and one write backward, at the measured device-to-device copy bandwidth) and the
speed-up.

    python -m benchmarks.logprob_kernels [--rows 12288] [--vocab 163840] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks._common import device_copy_bandwidth
from rlinf.models.megatron import logprobs


def fwd_bwd_ms(logits, targets, weights, repeats: int) -> float:
    def once():
        x = logits.detach().requires_grad_(True)
        lp, h = logprobs.vocab_parallel_logprobs(x, targets)
        ((lp * weights[0]).sum() + (h * weights[1]).sum()).backward()

    once()  # compiles the kernels
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        once()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=12288, help="positions (the slice's response tokens)")
    parser.add_argument("--vocab", type=int, default=163840, help="columns on this rank (V / TP)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    bandwidth = device_copy_bandwidth()
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(args.rows, args.vocab, device="cuda", generator=g) * 2).bfloat16()
    targets = torch.randint(0, args.vocab, (args.rows,), device="cuda", generator=g)
    weights = torch.randn(2, args.rows, device="cuda", generator=g)
    fused = fwd_bwd_ms(logits, targets, weights, args.repeats)
    kernels = logprobs._kernels
    logprobs._kernels = lambda flat: None
    try:
        chunked = fwd_bwd_ms(logits, targets, weights, args.repeats)
    finally:
        logprobs._kernels = kernels
    moved = 3 * logits.numel() * logits.element_size()
    bound = moved / bandwidth * 1e3
    print(json.dumps({
        "benchmark": "logprob_kernels",
        "gpu": torch.cuda.get_device_name(),
        "rows": args.rows,
        "vocab": args.vocab,
        "fused_ms": round(fused, 3),
        "chunked_ms": round(chunked, 3),
        "speedup": round(chunked / fused, 2),
        "hbm_bound_ms": round(bound, 3),
        "fused_share_of_bound": round(bound / fused, 3),
        "copy_bandwidth_gb_s": round(bandwidth / 1e9),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
