"""Adam's second moment stored in bf16: rounded to nearest (Transformer Engine's FusedAdam) against
rounded stochastically (rlinf's CompactAdamW), each against the fp32-state Adam on the same
gradients. Prints JSON: for each gradient stream, at each checkpoint step, the median over
parameters of the step-size ratio sqrt(v_hat fp32 / v_hat stored), 1.0 when the stored moment is
exact.

    python -m benchmarks.adam_moment_rounding [--steps 2000] [--params 200000] [--beta2 0.999]

The update follows the FusedAdam kernel: the maths in fp32, `v = beta2 v + (1 - beta2) g^2`, then
the store. With beta2 = 0.999 a bf16 moment rounded to nearest cannot decay (the 1e-3 step is below
half its spacing), so it only grows; rlinf.config.megatron_settings refuses that combination where
TE runs the optimizer.
"""

from __future__ import annotations

import argparse
import json

import torch

from rlinf.models.megatron.compact_adamw import round_to_bf16_stochastically

CHECKPOINTS = (100, 500, 1000, 2000, 4000)
STORES = {
    "bf16_nearest": lambda v: v.to(torch.bfloat16).float(),
    "bf16_stochastic": lambda v: round_to_bf16_stochastically(v).float(),
}


def gradients(stream: str, steps: int, params: int, generator: torch.Generator):
    for step in range(1, steps + 1):
        g = torch.randn(params, generator=generator) * 1e-3
        if stream == "heavy_tailed":  # Student-t with 3 degrees of freedom, as |t3| capped at 50
            chi2 = torch.randn(3, params, generator=generator).pow(2).sum(0)
            g = g * (torch.randn(params, generator=generator) / (chi2 / 3).sqrt()).abs().clamp(max=50)
        if stream == "one_spike" and step == steps // 10:
            g = g * 30
        yield step, g


def run(stream: str, steps: int, params: int, beta2: float, seed: int) -> dict[str, dict[int, float]]:
    exact = torch.zeros(params)
    stored = {name: torch.zeros(params) for name in STORES}
    out: dict[str, dict[int, float]] = {name: {} for name in STORES}
    torch.manual_seed(seed)  # the stochastic rounding's bits
    for step, g in gradients(stream, steps, params, torch.Generator().manual_seed(seed)):
        square = (1 - beta2) * g * g
        exact = beta2 * exact + square
        for name, store in STORES.items():
            stored[name] = store(beta2 * stored[name] + square)
        if step in CHECKPOINTS:
            for name in STORES:  # the bias correction cancels in the ratio
                out[name][step] = round((exact / stored[name]).sqrt().median().item(), 3)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--params", type=int, default=200_000)
    parser.add_argument("--beta2", type=float, default=0.999)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    streams = ("gaussian", "one_spike", "heavy_tailed")
    result = {
        "benchmark": "adam_moment_rounding",
        "beta2": args.beta2,
        "params": args.params,
        "steps": args.steps,
        "step_size_ratio_median": {
            s: run(s, args.steps, args.params, args.beta2, args.seed) for s in streams
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
