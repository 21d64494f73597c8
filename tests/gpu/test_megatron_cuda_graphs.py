"""The Megatron actor's per-layer CUDA graphs (`actor.model.cuda_graph_impl: transformer_engine`;
rlinf.models.megatron.cuda_graphs) on one GPU, against megatron's eager pass from the same weights:

- three rounds of a GRPO step's actor work: the logprob pass (eval mode, trimmed micro-batches,
  never graphed), a train call from its values less 0.05, the logprob pass again. The first train
  call captures the graphs (`time/cuda_graph_capture` > 0, one pair on every layer that has a
  graphed part), the second replays them (each graphed layer's graph once per micro-batch), and
  after offload / onload the third captures them again;
- after each train call, one forward / backward of the same micro-batches runs eager (the layers'
  graphs set aside) and one graphed, from the same updated weights: the same loss, ratio and clip
  fractions, and gradients within bf16 precision, parameter by parameter. Graphs that replayed
  stale weights, stale dispatcher state or a capture's leftovers would differ. Both pad to the
  graphs' fixed shape (that padding leaves the maths unchanged is
  tests/megatron_cpu/test_cuda_graph_shape.py's);
- packed micro-batches (`actor.pack_sequences`) with the router graphed and the attention eager.

Each comparison starts from the same weights: two runs (eager, graphed) from the same checkpoint
drifted apart after one update on the slice (mean logprob 0.04-0.08 apart, H100), although their
first calls' losses agreed bit for bit. Adam's first steps move each weight by about lr times the
sign of its gradient, which turns rounding differences into different updates.

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


def config(path: Path, *, packed: bool) -> Config:
    # the precision-aware optimizer (bf16 moments in TE's FusedAdam)
    cfg = actor_config(path, "bf16", lr=1e-5, mbs=MBS, gbs=ROWS, moments="bf16")
    modules = ("moe_router", "moe_preprocess") if packed else ("attn", "moe_router", "moe_preprocess")
    model = replace(cfg.actor.model, cuda_graph_impl="transformer_engine", cuda_graph_modules=modules)
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


def counting(actor) -> tuple[list[int], dict]:
    """Count the runs of every held graph (in the returned one-item list); the graphs as they were."""
    calls, held = [0], {m: m.cuda_graphs for m in actor.graphs.graphed_modules()}
    for module, graphs in held.items():
        module.cuda_graphs = [Counted(g, calls) for g in graphs]
    return calls, held


def put_back(held: dict) -> None:
    for module, graphs in held.items():
        module.cuda_graphs = graphs


def layer_counts(actor) -> tuple[int, int]:
    """(decoder layers, MoE layers) of the actor's model."""
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_layer import TransformerLayer

    layers = [m for chunk in actor.model for m in chunk.modules() if isinstance(m, TransformerLayer)]
    return len(layers), sum(isinstance(layer.mlp, MoELayer) for layer in layers)


def one_pass(actor, micros) -> dict:
    """One forward / backward over `micros` (the training path, no optimizer step): summed metrics;
    every parameter's gradient is left in its main_grad."""
    from rlinf.algorithms import LossNormalizer
    from rlinf.workers.actor.policy_update import _loss_fn

    for chunk in actor.model:
        chunk.train()
        chunk.zero_grad_buffer()
    normalizer = LossNormalizer.from_masks([m.response_mask for m in micros])
    metrics = actor.forward_backward(micros, _loss_fn(actor, actor.cfg.algorithm, normalizer))
    return {k: sum(float(m[k]) for m in metrics) for k in metrics[0]}


def main_grads(actor) -> dict[str, torch.Tensor]:
    """Every parameter's main_grad (where `one_pass` leaves its gradient), by name."""
    return {n: p.main_grad for chunk in actor.model for n, p in chunk.named_parameters()}


def eager_pass(actor, micros) -> dict:
    """`one_pass` with every layer's graphs set aside."""
    held = {m: m.cuda_graphs for m in actor.graphs.graphed_modules()}
    for module in held:
        module.cuda_graphs = []
    try:
        return one_pass(actor, micros)
    finally:
        put_back(held)


def grad_difference(actor, reference: dict[str, torch.Tensor]) -> dict:
    """The gradients now against `reference`: the global relative difference, each parameter's
    (relative to its own norm) with its share of the gradient norm, and the five that differ most."""
    diffs = {n: (g - reference[n]).norm().item() for n, g in main_grads(actor).items()}
    norms = {n: g.norm().item() for n, g in reference.items()}
    total = sum(v * v for v in norms.values()) ** 0.5
    rel = {n: diffs[n] / max(norms[n], 1e-30) for n in diffs}
    worst = sorted(rel, key=rel.__getitem__, reverse=True)[:5]
    return {
        "grad_norm": total,
        "grad_rel_diff": sum(v * v for v in diffs.values()) ** 0.5 / total,
        "param_rel_diff": rel,
        "param_norm_share": {n: norms[n] / total for n in norms},
        "worst": [[n, rel[n], norms[n] / total] for n in worst],
    }


def eager_and_graphed(actor, micros) -> dict:
    """The same micro-batches eager (every layer's graphs set aside) and graphed, from the same
    weights: their metrics and graph runs, and the graphed gradients against the eager ones
    (`grad_difference`)."""
    eager = eager_pass(actor, micros)
    eager_grads = {n: g.detach().clone() for n, g in main_grads(actor).items()}
    actor.graphs.ensure_captured()  # held: puts the dispatchers' state back, as a train call does
    runs, held = counting(actor)
    try:
        graphed = one_pass(actor, micros)
    finally:
        put_back(held)
    return {"eager": eager, "graphed": graphed, "graph_runs": runs[0], **grad_difference(actor, eager_grads)}


def fresh_old_logprobs(actor, batch):
    """`batch` with old logprobs from the actor's logprob pass now, less 0.05 (the ratio then sits
    at exp(0.05), up to the trimmed / padded shapes' rounding)."""
    logprobs = with_logprobs(batch, [actor.compute_logprobs(batch)]).old_logprobs
    return replace(batch, old_logprobs=logprobs - 0.05)


def three_train_calls(cfg: Config, batch) -> dict:
    """Three rounds of: the logprob pass, a train call (it captures the graphs in rounds 1 and 3:
    offload / onload before round 3), the logprob pass again, and eager and graphed passes from
    the updated weights."""
    from rlinf.workers.actor.megatron_actor import MegatronActor

    actor = MegatronActor(cfg)
    out: dict = {"train": [], "compared": [], "train_runs": [], "layers_and_moe": layer_counts(actor)}
    graphs = actor.graphs
    try:
        for step in range(3):
            if step == 2:
                actor.offload()
                out["graphed_offloaded"] = graphs.graphed_layers()
                actor.onload()
            runs, held = counting(actor)  # nothing held yet in rounds 1 and 3
            out["train"].append(actor.train(fresh_old_logprobs(actor, batch), step=step))
            if held:
                put_back(held)
            out["train_runs"].append(runs[0])
            out["captures"], out["graphed"] = graphs.captures, graphs.graphed_layers()
            trained = fresh_old_logprobs(actor, batch)
            micros = [trained.select(list(range(i, i + MBS))).trimmed() for i in range(0, ROWS, MBS)]
            out["compared"].append(eager_and_graphed(actor, micros))
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
    try:
        out = three_train_calls(config(path, packed=packed), batch)
    finally:
        torch.cuda.set_stream(torch.cuda.default_stream())  # the graph actor's side stream
    layers, moe_layers = out["layers_and_moe"]
    keys = ("actor/loss", "actor/ratio_mean", "actor/clip_fraction_high", "actor/clip_fraction_low")
    compared = out["compared"]
    capture = [t["time/cuda_graph_capture"] for t in out["train"]]
    record(
        f"CUDA graphs vs eager from the same weights ({which}{', packed' if packed else ''}, bf16)",
        **{k: [[c["eager"][k], c["graphed"][k]] for c in compared] for k in keys},
        grad_norm=[c["grad_norm"] for c in compared],
        grad_rel_diff=[c["grad_rel_diff"] for c in compared],
        worst_params=[c["worst"] for c in compared],
        graphed_layers=out["graphed"],
        decoder_layers=layers,
        graph_runs_train=out["train_runs"],
        graph_runs_compared=[c["graph_runs"] for c in compared],
        captures=out["captures"],
        capture_seconds=capture,
    )
    # every layer has attention; packed, only the MoE layers have a graphed part (the router)
    assert out["graphed"] == (moe_layers if packed else layers) > 0
    per_pass = out["graphed"] * ROWS // MBS  # each graphed layer's graph once per micro-batch
    assert out["train_runs"] == [0, per_pass, 0]  # rounds 1 and 3 capture, round 2 replays
    assert [c["graph_runs"] for c in compared] == [per_pass] * 3
    assert out["captures"] == 2 and out["graphed_offloaded"] == 0  # again after the onload
    assert capture[0] > 0 and capture[1] == 0 and capture[2] > 0
    one_token = 1 / int(batch.response_mask.sum())
    for step, (c, t) in enumerate(zip(compared, out["train"], strict=True)):
        assert t["actor/skipped_steps"] == 0, step
        for k in keys:  # the same forward from the same weights; a clip fraction moves by tokens
            tolerance = one_token if "clip" in k else 1e-6
            assert c["graphed"][k] == pytest.approx(c["eager"][k], rel=1e-3, abs=tolerance), (step, k)
        # bf16 keeps 8 significant bits: gradients within 2^-8 of each other, overall and for every
        # parameter that carries at least 0.1% of the gradient norm
        assert c["grad_rel_diff"] <= 2**-8, step
        for name, rel in c["param_rel_diff"].items():
            if c["param_norm_share"][name] >= 1e-3:
                assert rel <= 2**-8, (step, name, rel)
