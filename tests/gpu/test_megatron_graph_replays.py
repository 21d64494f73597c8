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

More knobs, for finding the race, each removing one suspect:
- `RLINF_REPLAY_SETTINGS`: comma-separated megatron provider settings, as
  benchmarks/actor_throughput.py's --megatron-setting takes them (benchmarks/megatron_variants.py),
  e.g. `attention_backend=unfused`, `apply_rope_fusion=false`;
- `RLINF_REPLAY_BUFFER_REUSE=0`: Transformer Engine's capture without the input / output buffers
  megatron-core shares between the layers' graphs;
- `RLINF_REPLAY_DTOH=current`: megatron's MoE dispatcher copies its token counts to the host on the
  current stream, not on its own side stream (the one place another stream reads a graph's output);
- `RLINF_REPLAY_GROUPED_GEMM=serial`: TE's routed-expert GEMMs one by one on the current stream,
  not on TE's four side streams of multi-stream cuBLAS;
- `RLINF_REPLAY_SYNC_GRAPHS=before|after|both`: the device synchronised around every graph replay;
- `RLINF_REPLAY_MODULES=attn` (or `moe_router+moe_preprocess`): graph only those parts;
- `RLINF_REPLAY_ROTATE=1`: the knobs that can change between passes of one actor (the side
  stream, the serial GEMMs, the syncs around replays, the unshared buffers with a recapture) in
  turn after each train call, with the shipped graphs as the control, in one process (`ROTATION`).

Every pass's gradient difference against the first eager pass is recorded, with every parameter
that differs (backward runs from the last layer down, so the highest layer with a difference holds
the first wrong value). Run:
bash tests/gpu/run_megatron_checks.sh graph-replays (tests/gpu/run_megatron_checks.sh lists the
variants it runs).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import replace
from unittest import mock

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
KNOBS = (
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
    "CUDA_LAUNCH_BLOCKING",
    "RLINF_REPLAY_SETTINGS",
    "RLINF_REPLAY_BUFFER_REUSE",
    "RLINF_REPLAY_DTOH",
    "RLINF_REPLAY_GROUPED_GEMM",
    "RLINF_REPLAY_SYNC_GRAPHS",
    "RLINF_REPLAY_MODULES",
    "RLINF_REPLAY_ROTATE",
)
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
        "differing": {n.split("decoder.")[-1]: r for n, r in d["param_rel_diff"].items() if r},
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


@contextlib.contextmanager
def own_graph_buffers(actor=None):
    """megatron-core captures with TE's `_reuse_graph_input_output_buffers=True` (one layer's graph
    inputs and outputs reuse another's); capture with it off. Given the actor, its graphs are released
    on entry and on exit, so that the next train pass captures them again."""
    from megatron.core.transformer import cuda_graphs

    capture = cuda_graphs.make_graphed_callables

    def own_buffers(*args, **kwargs):
        kwargs["_reuse_graph_input_output_buffers"] = False
        return capture(*args, **kwargs)

    with mock.patch.object(cuda_graphs, "make_graphed_callables", own_buffers):
        if actor is not None:
            actor.graphs.release()
        try:
            yield
        finally:
            if actor is not None:
                actor.graphs.release()


def dtoh_on_current_stream(actor=None) -> contextlib.AbstractContextManager:
    """megatron's alltoall dispatcher copies its token counts to the host on a class-wide side stream
    (`cuda_dtoh_stream`, made by the first dispatcher); point it at the actor's current stream."""
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    assert MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is not None, "no alltoall dispatcher was built"
    return mock.patch.object(MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", torch.cuda.current_stream())


def serial_grouped_gemm(actor=None) -> contextlib.AbstractContextManager:
    """TE's GroupedLinear runs its per-expert GEMMs on four side streams of its own (multi-stream
    cuBLAS, joined before it returns); run them one after another on the current stream instead.
    bf16 without biases only: the slice's experts."""
    from transformer_engine.pytorch.cpp_extensions import general_gemm
    from transformer_engine.pytorch.module import grouped_linear

    def serial(
        A, B, out, quantization_params, out_dtype, layout="TN", m_splits=None, gelu=False, grad=False,
        accumulate=False, bias=None, use_bias=False, use_split_accumulator=False, D_dtype=None,
        single_output=False,
    ):  # fmt: skip
        assert not gelu and not use_bias and D_dtype is None, "serial grouped GEMM: bf16, no bias, no GELU"
        if single_output:
            starts = itertools.accumulate(m_splits, initial=0)
            views = [out[0][a:b] for a, b in itertools.pairwise(starts)]
        else:
            views = out
        for a, b, o in zip(A, B, views, strict=True):
            if a.numel() == 0 or b.numel() == 0:  # an expert without tokens
                if o.numel() and not accumulate:
                    o.zero_()
                continue
            general_gemm(
                a, b, out_dtype=o.dtype, out=o, layout=layout, accumulate=accumulate,
                use_split_accumulator=use_split_accumulator, grad=grad,
            )  # fmt: skip
        return out, [None] * len(A), None

    return mock.patch.object(grouped_linear, "general_grouped_gemm", serial)


def synced_graph_replays(where: str = "both") -> contextlib.AbstractContextManager:
    """The device synchronised before and / or after every CUDA graph replay (TE replays
    torch.cuda.CUDAGraph objects); never inside a capture."""
    assert where in ("before", "after", "both"), f"RLINF_REPLAY_SYNC_GRAPHS={where}: before, after or both"
    replay = torch.cuda.CUDAGraph.replay

    def synced(graph) -> None:
        if where != "after" and not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
        replay(graph)
        if where != "before" and not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()

    return mock.patch.object(torch.cuda.CUDAGraph, "replay", synced)


# RLINF_REPLAY_ROTATE=1: after each train call, every one of these in turn, GRAPHED_PASSES graphed
# passes each, in one process (each takes one suspect out; "as shipped" is the control)
ROTATION = {
    "as shipped": lambda actor: contextlib.nullcontext(),
    "dtoh on the current stream": dtoh_on_current_stream,
    "serial expert GEMMs": serial_grouped_gemm,
    "sync around graph replays": lambda actor: synced_graph_replays("both"),
    "own graph buffers": own_graph_buffers,
}


def graphed_modules(cfg):
    """The config with RLINF_REPLAY_MODULES's parts graphed ("+" joins them), if set."""
    text = os.environ.get("RLINF_REPLAY_MODULES")
    if not text:
        return cfg
    model = replace(cfg.actor.model, cuda_graph_modules=tuple(text.split("+")))
    return replace(cfg, actor=replace(cfg.actor, model=model))


def provider_settings() -> contextlib.AbstractContextManager:
    text = os.environ.get("RLINF_REPLAY_SETTINGS", "")
    if not text:
        return contextlib.nullcontext()
    from benchmarks.megatron_variants import parse_setting, provider_overrides

    return provider_overrides({k: v for item in text.split(",") for k, v in parse_setting(item).items()})


@pytest.mark.usefixtures("transformer_engine")
def test_repeated_passes_give_the_same_gradients(moonlight_slice):
    from rlinf.workers.actor.megatron_actor import MegatronActor

    variant = os.environ.get("RLINF_REPLAY_VARIANT", "kernels")
    assert variant in VARIANTS, f"RLINF_REPLAY_VARIANT={variant}: one of {VARIANTS}"
    use_variant(variant)
    rotate = os.environ.get("RLINF_REPLAY_ROTATE") == "1"
    knobs = contextlib.ExitStack()  # the per-process knobs, for the whole test
    if os.environ.get("RLINF_REPLAY_BUFFER_REUSE") == "0":
        knobs.enter_context(own_graph_buffers())
    if os.environ.get("RLINF_REPLAY_GROUPED_GEMM") == "serial":
        knobs.enter_context(serial_grouped_gemm())
    if os.environ.get("RLINF_REPLAY_SYNC_GRAPHS"):
        knobs.enter_context(synced_graph_replays(os.environ["RLINF_REPLAY_SYNC_GRAPHS"]))
    batch = synthetic_batch(vocab_of(moonlight_slice), rows=ROWS, seed=21)
    with provider_settings():
        actor = MegatronActor(graphed_modules(config(moonlight_slice, packed=False)))
    if os.environ.get("RLINF_REPLAY_DTOH") == "current":
        knobs.enter_context(dtoh_on_current_stream())  # the actor has made its stream the current one
    rotation = ROTATION if rotate else {"graphed": ROTATION["as shipped"]}
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
            for name, knob in rotation.items():
                with knob(actor):
                    for replay in range(GRAPHED_PASSES):
                        actor.graphs.ensure_captured()
                        one_pass(actor, micros)
                        passes.append(pass_record(actor, reference, step, f"{name} {replay}"))
            del reference
    finally:
        knobs.close()
        actor.offload()
        del actor
        free()
        torch.cuda.set_stream(torch.cuda.default_stream())
    env = {k: os.environ[k] for k in KNOBS if k in os.environ}
    differing_by = {n: sum(p["rel"] != 0.0 for p in passes if p["pass"].startswith(n)) for n in rotation}
    record(
        f"repeated train passes from the same weights (slice, {variant})",
        env=env,
        graphed_passes_differing=differing_by,
        graphed_passes_each=STEPS * GRAPHED_PASSES,
        passes=passes,
    )
    eager = [p for p in passes if p["pass"] == "eager"]
    assert all(p["rel"] == 0.0 for p in eager), eager  # the reference itself repeats
    differing = [p for p in passes if p["rel"] != 0.0]
    assert not differing, differing
