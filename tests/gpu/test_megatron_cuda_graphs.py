"""The Megatron actor's per-layer CUDA graphs (`actor.model.cuda_graph_impl: transformer_engine`;
rlinf.models.megatron.cuda_graphs) on one GPU, against the eager actor from the same checkpoint:

- the logprob pass (eager in both: megatron replays graphs in training only) gives the same logprobs
  from the same weights (the later calls' mean difference, weights a few updates on, is recorded);
- the graphs are captured at the first train call (`time/cuda_graph_capture` > 0), one pair on every
  layer that has a graphed part, and the second call replays them (each graphed layer's graph runs
  once per micro-batch) without capturing again;
- every train call gives the eager actor's loss, ratio and grad norm within bf16 rounding. Each call
  takes its old logprobs from the actor's own logprob pass just before, less 0.05: the ratio is
  exp(0.05) exactly when the train forward computes what the logprob pass computes (graphs that
  replayed stale weights would move it), and no token reaches the clip range, where the gradient
  comes from a few tokens and small differences grow. The eager actor is handed the graph actor's
  fixed micro-batch shape, so that both run the same GEMM shapes (that padding leaves the maths
  unchanged is tests/megatron_cpu/test_cuda_graph_shape.py's; in bf16 other shapes pick other
  kernels: against an unpadded eager actor the slice's first-call loss differed by 6%);
- after offload / onload the graphs are captured again and the third call matches too;
- packed micro-batches (`actor.pack_sequences`) with the router graphed and the attention eager.

Needs Transformer Engine (the graphs are TE's). Run: bash tests/gpu/run_megatron_checks.sh graphs
(its own pytest process: the graph actor sets a side CUDA stream and TE's RNG tracker for the process).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from gpu_checks import record
from test_megatron_actor import actor_config, free, synthetic_batch, vocab_of

from rlinf.config.schema import Config
from rlinf.workers.actor.base import with_logprobs

ROWS, MBS = 8, 4  # one minibatch of 2 micro-batches


@pytest.fixture(scope="module")
def transformer_engine(megatron_installed) -> None:
    from rlinf.models.megatron import te_placeholder

    if not te_placeholder.real_te_available():
        pytest.skip(
            "needs Transformer Engine (the .wte wheel folder, tests/gpu/README.md): the graphs are TE's"
        )


def config(path: Path, *, graphs: bool, packed: bool) -> Config:
    # the recipe's optimizer (bf16 moments in TE's FusedAdam): two slice actors' state fits 80 GB.
    # Adam's first step moves every weight by lr times the sign of its gradient, rounding noise
    # included: at 1e-6 most bf16 weights move only where rounding noise tips them over, so the
    # update is mostly noise; at 1e-5 the signal leads.
    cfg = actor_config(path, "bf16", lr=1e-5, mbs=MBS, gbs=ROWS, moments="bf16")
    modules = ("moe_router", "moe_preprocess") if packed else ("attn", "moe_router", "moe_preprocess")
    model = replace(
        cfg.actor.model,
        cuda_graph_impl="transformer_engine" if graphs else "none",
        cuda_graph_modules=modules if graphs else cfg.actor.model.cuda_graph_modules,
    )
    # 32 tokens a row: the longest synthetic row is 12 + 10
    return replace(cfg, actor=replace(cfg.actor, seq_length=32, pack_sequences=packed, model=model))


class Counted:
    """A graphed callable whose runs are counted; anything else (megatron's delete_cuda_graphs calls
    `reset()`) goes to the graph."""

    def __init__(self, graph, calls: list[int]) -> None:
        self.graph, self.calls = graph, calls

    def __call__(self, *args, **kwargs):
        self.calls[0] += 1
        return self.graph(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.graph, name)


def counted_replays(actor) -> list[int]:
    """Count the runs of every held graph (in the returned one-item list)."""
    calls = [0]
    for chunk in actor.model:
        for module in chunk.modules():
            graphs = getattr(module, "cuda_graphs", None)
            if graphs:
                module.cuda_graphs = [Counted(g, calls) for g in graphs]
    return calls


def layer_counts(actor) -> tuple[int, int]:
    """(decoder layers, MoE layers) of the actor's model."""
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_layer import TransformerLayer

    layers = [m for chunk in actor.model for m in chunk.modules() if isinstance(m, TransformerLayer)]
    return len(layers), sum(isinstance(layer.mlp, MoELayer) for layer in layers)


def train_from_own_logprobs(actor, batch, out: dict, step: int) -> None:
    """The logprob pass, then a train call from those logprobs less 0.05 (the eval-mode logprob
    pass never replays the graphs); both kept in `out`."""
    logprobs = with_logprobs(batch, [actor.compute_logprobs(batch)]).old_logprobs
    out["logprobs"].append(logprobs)
    out["train"].append(actor.train(replace(batch, old_logprobs=logprobs - 0.05), step=step))


def three_train_calls(cfg: Config, batch, shape=None) -> dict:
    """Three rounds of the logprob pass then a train call from those logprobs less 0.05, with an
    offload / onload before the third; what the graphs did on the way. `shape`: the micro-batch
    shape an eager actor pads to."""
    from rlinf.workers.actor.megatron_actor import MegatronActor

    actor = MegatronActor(cfg)
    if shape is not None:
        actor.train_shape = shape
    out: dict = {"logprobs": [], "train": [], "layers_and_moe": layer_counts(actor)}
    try:
        graphs = actor.graphs
        train_from_own_logprobs(actor, batch, out, step=0)
        if graphs is not None:
            out["graphed"] = graphs.graphed_layers()
            replays = counted_replays(actor)
        train_from_own_logprobs(actor, batch, out, step=1)
        if graphs is not None:
            out["replays"], out["captures_before_offload"] = replays[0], graphs.captures
        actor.offload()
        if graphs is not None:
            out["graphed_offloaded"] = graphs.graphed_layers()
        actor.onload()
        train_from_own_logprobs(actor, batch, out, step=2)
        if graphs is not None:
            out["captures"] = graphs.captures
    finally:
        # megatron's DDP stays reachable from autograd hooks (and, after a failure, from the
        # traceback): leave only host memory behind, so that the next case has the GPU
        actor.offload()
        del actor
        free()
    return out


@pytest.mark.parametrize(
    ("which", "packed"),
    [("gpu_tiny", False), ("moonlight_slice", False), ("gpu_tiny", True)],
    ids=["gpu_tiny", "moonlight_slice", "gpu_tiny-packed"],
)
def test_graphed_training_matches_eager_from_the_same_weights(transformer_engine, request, which, packed):
    path = request.getfixturevalue(which)
    batch = synthetic_batch(vocab_of(path), rows=ROWS, seed=21)
    from rlinf.config.megatron_graphs import fixed_train_shape

    graphs_cfg = config(path, graphs=True, packed=packed)
    shape = fixed_train_shape(graphs_cfg.actor)
    eager = three_train_calls(config(path, graphs=False, packed=packed), batch, shape=shape)
    try:
        graphed = three_train_calls(graphs_cfg, batch)
    finally:
        torch.cuda.set_stream(torch.cuda.default_stream())  # the graph actor's side stream
    mask = batch.response_mask
    # max over tokens (first call: the same weights), mean (later calls: weights three updates on)
    logprob_diff = [(g - e)[mask].abs() for g, e in zip(graphed["logprobs"], eager["logprobs"], strict=True)]
    first_max, later_mean = logprob_diff[0].max().item(), [d.mean().item() for d in logprob_diff[1:]]
    layers, moe_layers = graphed["layers_and_moe"]
    keys = ("actor/loss", "actor/ratio_mean", "actor/grad_norm")
    capture = [m["time/cuda_graph_capture"] for m in graphed["train"]]
    record(
        f"CUDA graphs vs eager ({which}{', packed' if packed else ''}, bf16)",
        **{k: [[e[k], g[k]] for e, g in zip(eager["train"], graphed["train"], strict=True)] for k in keys},
        logprob_max_abs_diff_first=first_max,
        logprob_mean_abs_diff_later=later_mean,
        graphed_layers=graphed["graphed"],
        decoder_layers=layers,
        replays_second_call=graphed["replays"],
        captures=graphed["captures"],
        capture_seconds=capture,
    )
    # every layer has attention; packed, only the MoE layers have a graphed part (the router)
    assert graphed["graphed"] == (moe_layers if packed else layers) > 0
    assert graphed["replays"] == graphed["graphed"] * ROWS // MBS  # once per layer per micro-batch
    assert graphed["captures_before_offload"] == 1 and graphed["graphed_offloaded"] == 0
    assert graphed["captures"] == 2  # again after the onload
    assert capture[0] > 0 and capture[1] == 0 and capture[2] > 0
    assert first_max <= 1e-2  # both eager: the same function, MoE scatter_add order aside
    for step, (e, g) in enumerate(zip(eager["train"], graphed["train"], strict=True)):
        assert g["actor/skipped_steps"] == 0, step
        assert g["actor/loss"] == pytest.approx(e["actor/loss"], rel=2e-2, abs=2e-3), step
        assert g["actor/ratio_mean"] == pytest.approx(e["actor/ratio_mean"], rel=5e-3), step
        for clipped in ("actor/clip_fraction_low", "actor/clip_fraction_high"):
            assert g[clipped] == e[clipped] == 0, (step, clipped)
        assert g["actor/grad_norm"] == pytest.approx(e["actor/grad_norm"], rel=3e-2), step
