"""Repeated passes of the Megatron actor's train path from the same weights and micro-batches give
the same gradients, bit for bit: eager twice, then graphed four times (per-layer CUDA graphs,
`actor.model.cuda_graph_impl: transformer_engine`), after each of four train calls on the slice.

Eager passes repeat exactly (no atomics in the slice's eager train path). Graphed passes replay the
same kernels on the same inputs, so any difference between them is a race: a buffer read before it
is written, or written while still being read. `RLINF_REPLAY_VARIANT` picks what runs around the LM
head, one variant per process (the graph actor sets the process's stream and TE's RNG tracker):

- `kernels` (default): the Triton logprob kernels, as the actor runs on a GPU;
- `chunked`: the chunked torch logprob path;
- `synced`: the kernels, with the device synchronised before and after each launch;
- `synced-before` / `synced-after`: only before, or only after, each launch.

Two more knobs, for finding the race: `RLINF_REPLAY_SETTINGS` (comma-separated megatron provider
settings, as benchmarks/actor_throughput.py's --megatron-setting: `attention_backend=unfused`,
`apply_rope_fusion=false`) and `RLINF_REPLAY_BUFFER_REUSE=0` (Transformer Engine's capture without
the input / output buffers megatron-core shares between the layers' graphs).

Every pass's gradient difference against the first eager pass is recorded. Run:
bash tests/gpu/run_megatron_checks.sh graph-replays (tests/gpu/run_megatron_checks.sh lists the
variants it runs).
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from gpu_checks import record
from test_megatron_actor import free, synthetic_batch, vocab_of
from test_megatron_cuda_graphs import (  # noqa: F401  (transformer_engine: a fixture)
    MBS,
    ROWS,
    config,
    fresh_old_logprobs,
    one_pass,
    put_back,
    transformer_engine,
)

VARIANTS = ("kernels", "chunked", "synced", "synced-before", "synced-after")
STEPS, GRAPHED_PASSES = 4, 4


def main_grads(actor) -> dict[str, torch.Tensor]:
    return {n: p.main_grad for chunk in actor.model for n, p in chunk.named_parameters()}


def difference(actor, reference: dict[str, torch.Tensor]) -> dict:
    """The gradients now against `reference`: the global relative difference and the three
    parameters that differ most (relative to their own norm, with their share of the norm)."""
    now = main_grads(actor)
    diffs = {n: (now[n] - g).norm().item() for n, g in reference.items()}
    norms = {n: g.norm().item() for n, g in reference.items()}
    total = sum(v * v for v in norms.values()) ** 0.5
    worst = sorted(diffs, key=lambda n: diffs[n] / max(norms[n], 1e-30), reverse=True)[:3]
    return {
        "rel": sum(v * v for v in diffs.values()) ** 0.5 / total,
        "worst": [[n, diffs[n] / max(norms[n], 1e-30), norms[n] / total] for n in worst if diffs[n]],
    }


def use_variant(variant: str) -> None:
    from rlinf.models.megatron import logprobs, logprobs_triton

    if variant == "chunked":
        logprobs._kernels = lambda flat: None
    elif variant.startswith("synced"):
        before, after = variant != "synced-after", variant != "synced-before"
        for name in ("slice_stats", "slice_grad"):
            launch = getattr(logprobs_triton, name)

            def synced(*args, _launch=launch, **kwargs):
                if before:
                    torch.cuda.synchronize()
                out = _launch(*args, **kwargs)
                if after:
                    torch.cuda.synchronize()
                return out

            setattr(logprobs_triton, name, synced)


def without_buffer_reuse() -> None:
    """megatron-core captures with TE's `_reuse_graph_input_output_buffers=True` (one layer's graph
    inputs and outputs reuse another's); capture with it off."""
    from megatron.core.transformer import cuda_graphs

    capture = cuda_graphs.make_graphed_callables

    def own_buffers(*args, **kwargs):
        kwargs["_reuse_graph_input_output_buffers"] = False
        return capture(*args, **kwargs)

    cuda_graphs.make_graphed_callables = own_buffers


def provider_settings() -> contextlib.AbstractContextManager:
    text = os.environ.get("RLINF_REPLAY_SETTINGS", "")
    if not text:
        return contextlib.nullcontext()
    from benchmarks.actor_throughput import parse_setting, provider_overrides

    return provider_overrides({k: v for item in text.split(",") for k, v in parse_setting(item).items()})


@pytest.mark.usefixtures("transformer_engine")
def test_repeated_passes_give_the_same_gradients(moonlight_slice):
    from rlinf.workers.actor.megatron_actor import MegatronActor

    variant = os.environ.get("RLINF_REPLAY_VARIANT", "kernels")
    assert variant in VARIANTS, f"RLINF_REPLAY_VARIANT={variant}: one of {VARIANTS}"
    use_variant(variant)
    if os.environ.get("RLINF_REPLAY_BUFFER_REUSE") == "0":
        without_buffer_reuse()
    batch = synthetic_batch(vocab_of(moonlight_slice), rows=ROWS, seed=21)
    with provider_settings():
        actor = MegatronActor(config(moonlight_slice, packed=False))
    passes: list[dict] = []
    try:
        for step in range(STEPS):
            actor.train(fresh_old_logprobs(actor, batch), step=step)
            trained = fresh_old_logprobs(actor, batch)
            micros = [trained.select(list(range(i, i + MBS))).trimmed() for i in range(0, ROWS, MBS)]
            held = {m: m.cuda_graphs for m in actor.graphs.graphed_modules()}
            for module in held:
                module.cuda_graphs = []
            try:
                one_pass(actor, micros)
                reference = {n: g.detach().clone() for n, g in main_grads(actor).items()}
                one_pass(actor, micros)
                passes.append({"step": step, "pass": "eager", **difference(actor, reference)})
            finally:
                put_back(held)
            for replay in range(GRAPHED_PASSES):
                actor.graphs.ensure_captured()
                one_pass(actor, micros)
                passes.append({"step": step, "pass": f"graphed {replay}", **difference(actor, reference)})
            del reference
    finally:
        actor.offload()
        del actor
        free()
        torch.cuda.set_stream(torch.cuda.default_stream())
    env = {
        k: os.environ[k] for k in ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "NVTE_FUSED_ATTN") if k in os.environ
    }
    record(f"repeated train passes from the same weights (slice, {variant})", env=env, passes=passes)
    eager = [p for p in passes if p["pass"] == "eager"]
    assert all(p["rel"] == 0.0 for p in eager), eager  # the reference itself repeats
    differing = [p for p in passes if p["rel"] != 0.0]
    assert not differing, differing
