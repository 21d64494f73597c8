"""Where the Megatron actor's bf16 forward departs from HF's, op by op, on the GPU-tiny checkpoint.

Both models run the same full rows (no padding, positions 0..T-1) in fp32 (the reference) and in
bf16. Forward hooks (tests/megatron_cpu/op_trace.py, shared with the CPU's test_hf_parity.py) take
the embedding, every layer's attention output, MoE routing (the routing weights and the chosen
expert set per token), MLP output and layer output, then the final norm, the logits and the
next-token logprobs.
Each bf16 run's error against the fp32 run of the same model family is printed per point: relative
Frobenius error for activations, the share of tokens whose expert set differs from fp32's, and the
mean |logprob difference|. Then each Megatron provider setting in VARIANTS is switched on its own
and the test's own figure is taken again (tests/gpu/test_megatron_actor.py, compare_logprobs: mean
|logprob - HF fp32| over the response tokens of its synthetic batch, against HF bf16's).

    python3 tests/gpu/bf16_op_errors.py [--variants '{"name": {"setting": value}}']   (GPU, TE optional)

Prints JSON lines (one per run and point); run_megatron_checks.sh bf16-ops runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "megatron_cpu"))
from op_trace import errors, hf_points, megatron_points  # noqa: E402
from test_megatron_actor import (  # noqa: E402
    LOGPROB_ROWS,
    actor_config,
    free,
    hf_logprobs,
    synthetic_batch,
    vocab_of,
)

VARIANTS = {
    "default": {},
    "no_rope_fusion": {"apply_rope_fusion": False},
    "no_permute_fusion": {"moe_permute_fusion": False},
    "no_bias_activation_fusion": {"bias_activation_fusion": False},
    "sequential_experts": {"moe_grouped_gemm": False},
    # last: megatron-core fixes TE's attention kernel once per process
    "attention_unfused": {"attention_backend": "unfused"},
}


def full_rows(vocab: int, rows: int = 8, length: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, vocab, (rows, length), generator=g)


def hf_trace(path: Path, precision: str, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    from rlinf.models.hf_checkpoint import load_causal_lm

    model = load_causal_lm(str(path), precision=precision, device=torch.device("cuda"))
    trace = hf_points(model, tokens.cuda())
    del model
    free()
    return trace


def gpt_model(actor):
    return next(m for m in actor.model[0].modules() if type(m).__name__ == "GPTModel")


def megatron_trace(path: Path, precision: str, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    from rlinf.workers.actor.megatron_actor import MegatronActor

    actor = MegatronActor(actor_config(path, precision))
    model = gpt_model(actor)
    model.eval()
    trace = megatron_points(model, tokens.cuda())
    del actor, model
    free()
    return trace


def test_figure(path: Path, overrides: dict, exact: torch.Tensor, batch) -> float:
    """compare_logprobs' bf16 figure: mean |Megatron bf16 - HF fp32| over the response tokens."""
    from benchmarks.megatron_variants import provider_overrides
    from rlinf.workers.actor.base import with_logprobs
    from rlinf.workers.actor.megatron_actor import MegatronActor

    with provider_overrides(overrides):
        actor = MegatronActor(actor_config(path, "bf16"))
        got = with_logprobs(batch, [actor.compute_logprobs(batch)]).old_logprobs
        del actor
        free()
    return (got - exact)[batch.response_mask].abs().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/rlinf-gpu-ckpt/gpu-tiny-random"))
    parser.add_argument("--variants", type=json.loads, default=VARIANTS)
    parser.add_argument("--rows", type=int, default=LOGPROB_ROWS, help="rows of the test's synthetic batch")
    parser.add_argument("--no-trace", action="store_true", help="only the test's figure per variant")
    args = parser.parse_args()
    if not (args.checkpoint / "tiny_build.json").is_file():
        from rlinf.models.tiny import GPU_TINY_SETTINGS, build_tiny_checkpoint

        build_tiny_checkpoint(args.checkpoint, GPU_TINY_SETTINGS, bootstrap=False)
    if not args.no_trace:
        trace(args.checkpoint)
    figures(args.checkpoint, args.variants, args.rows)


def trace(checkpoint: Path) -> None:
    tokens = full_rows(vocab_of(checkpoint))
    hf32, hf16 = hf_trace(checkpoint, "fp32", tokens), hf_trace(checkpoint, "bf16", tokens)
    meg32, meg16 = (
        megatron_trace(checkpoint, "fp32", tokens),
        megatron_trace(checkpoint, "bf16", tokens),
    )
    rows = {
        "hf_bf16_vs_hf_fp32": errors(hf16, hf32),
        "megatron_bf16_vs_megatron_fp32": errors(meg16, meg32),
        "megatron_fp32_vs_hf_fp32": errors(meg32, hf32),
        "megatron_bf16_vs_hf_fp32": errors(meg16, hf32),
    }
    for point in hf32:
        print(json.dumps({"point": point, **{k: round(v[point], 6) for k, v in rows.items()}}), flush=True)


def figures(checkpoint: Path, variants: dict, rows: int) -> None:
    batch = synthetic_batch(vocab_of(checkpoint), rows=rows, response=32)
    exact = hf_logprobs(checkpoint, "fp32", batch)
    hf_noise = (hf_logprobs(checkpoint, "bf16", batch) - exact)[batch.response_mask].abs().mean().item()
    from benchmarks.megatron_variants import parse_setting

    for name, settings in variants.items():
        overrides = {}
        for key, value in settings.items():
            overrides.update(parse_setting(f"{key}={value}"))
        try:
            figure = test_figure(checkpoint, overrides, exact, batch)
            print(json.dumps({"variant": name, "rows": rows, "mean_abs_diff": figure, "hf_bf16_noise": hf_noise,
                              "ratio": figure / hf_noise}), flush=True)  # fmt: skip
        except Exception as error:  # a setting this build refuses: name it, go on
            print(
                json.dumps({"variant": name, "error": f"{type(error).__name__}: {error}"[:300]}), flush=True
            )


if __name__ == "__main__":
    main()
