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
    eager_pass,
    fresh_old_logprobs,
    grad_difference,
    main_grads,
    one_pass,
    transformer_engine,
)

VARIANTS = ("kernels", "chunked", "synced", "synced-before", "synced-after")
STEPS, GRAPHED_PASSES = 4, 4


def pass_record(actor, reference: dict[str, torch.Tensor], step: int, name: str) -> dict:
    """One pass's gradients against the first eager pass's: the global relative difference and the
    (up to three) parameters that differ most."""
    d = grad_difference(actor, reference)
    return {
        "step": step,
        "pass": name,
        "rel": d["grad_rel_diff"],
        "worst": [w for w in d["worst"][:3] if w[1]],
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
            eager_pass(actor, micros)
            reference = {n: g.detach().clone() for n, g in main_grads(actor).items()}
            eager_pass(actor, micros)
            passes.append(pass_record(actor, reference, step, "eager"))
            for replay in range(GRAPHED_PASSES):
                actor.graphs.ensure_captured()
                one_pass(actor, micros)
                passes.append(pass_record(actor, reference, step, f"graphed {replay}"))
            del reference
    finally:
        actor.offload()
        del actor
        free()
        torch.cuda.set_stream(torch.cuda.default_stream())
    knobs = (
        "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
        "CUDA_LAUNCH_BLOCKING",
        "RLINF_REPLAY_SETTINGS",
        "RLINF_REPLAY_BUFFER_REUSE",
    )
    env = {k: os.environ[k] for k in knobs if k in os.environ}
    record(f"repeated train passes from the same weights (slice, {variant})", env=env, passes=passes)
    eager = [p for p in passes if p["pass"] == "eager"]
    assert all(p["rel"] == 0.0 for p in eager), eager  # the reference itself repeats
    differing = [p for p in passes if p["rel"] != 0.0]
    assert not differing, differing
