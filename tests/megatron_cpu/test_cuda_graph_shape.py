"""The fixed micro-batch shape of the Megatron actor's CUDA graphs (actor.model.cuda_graph_impl),
in megatron-core on the CPU (fp32, one gloo rank; no graphs here, they need a GPU and TE):

- every training micro-batch padded to the shape (rows of right padding; packed, sequences of
  padding tokens) gives the trimmed micro-batches' loss, metrics and every weight's gradient;
- a micro-batch larger than the shape is refused, naming the keys that size it;
- the graph provider fields rlinf translates for the Moonlight-shaped recipe pass megatron-core's
  own TransformerConfig checks, and what rlinf refuses megatron-core refuses too.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import build_actor, varied_batch  # noqa: E402

from rlinf.algorithms import LossNormalizer  # noqa: E402
from rlinf.config.megatron_graphs import TrainShape, cuda_graph_provider  # noqa: E402
from rlinf.config.schema import ModelConfig  # noqa: E402
from rlinf.workers.actor.policy_update import _loss_fn  # noqa: E402

# varied_batch: prompts of up to 9 tokens, responses of up to 11, 6 rows
SHAPES = {False: TrainShape(rows=4, tokens=32), True: TrainShape(rows=1, tokens=96)}


def loss_and_grads(actor, micros, shape: TrainShape | None):
    """One forward_backward over `micros` (the actor's training path) with the shape set or not:
    the micro-batches' summed loss and metrics, and every weight's main_grad."""
    model = actor.model[0]
    model.train()
    model.zero_grad_buffer()
    actor.train_shape = shape
    normalizer = LossNormalizer.from_masks([m.response_mask for m in micros])
    metrics = actor.forward_backward(micros, _loss_fn(actor, actor.cfg.algorithm, normalizer))
    summed = {k: sum(float(m[k]) for m in metrics) for k in metrics[0]}
    return summed, {n: p.main_grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_padding_to_the_graphs_shape_changes_no_loss_metric_or_gradient(
    on_cpu, cuda_device_is_cpu, tiny_megatron_checkpoint, packed
):
    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32", pack_sequences=packed)
    batch = varied_batch()
    with torch.no_grad():
        logprobs, _ = actor._logprobs(actor.model[0], batch)
    batch = replace(batch, old_logprobs=(logprobs - 0.05) * batch.response_mask)
    # 3 + 2 + 1 rows, each trimmed to its own width, as run_policy_update cuts them
    micros = [batch.select(rows).trimmed() for rows in ([0, 1, 2], [3, 4], [5])]
    eager_metrics, eager_grads = loss_and_grads(actor, micros, None)
    shaped_metrics, shaped_grads = loss_and_grads(actor, micros, SHAPES[packed])
    assert eager_metrics.keys() == shaped_metrics.keys()
    for name, value in eager_metrics.items():
        assert shaped_metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name
    assert eager_metrics["actor/loss"] != 0
    assert shaped_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        scale = grad.abs().max().item()
        assert scale > 0, name
        assert (shaped_grads[name] - grad).abs().max().item() <= 1e-5 * scale + 1e-7, name


def test_the_padded_forward_has_the_graphs_shape(on_cpu, tiny_megatron_checkpoint):
    """Right padding fills rows and columns; packed padding adds sequences no longer than the
    longest real one, so max_seqlen (the attention's cost) stays the real sequences'."""
    batch = varied_batch()
    micro = batch.select([0, 1, 2]).trimmed()
    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    inputs = actor._host_inputs(micro, SHAPES[False])
    assert inputs.tokens.shape == (4, 32) and inputs.positions.shape == (4, 32)
    assert (inputs.tokens[3] == 0).all()
    packed = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32", pack_sequences=True)
    tokens, positions, params, _ = packed._packed_thd(micro, SHAPES[True])
    real = int(micro.prompt_mask.sum() + micro.response_mask.sum())
    lengths = params.cu_seqlens_q.diff().tolist()
    assert tokens.shape == positions.shape == (1, 96) and sum(lengths) == 96
    assert params.max_seqlen_q == max(lengths[:3]) and sum(lengths[:3]) == real
    start = real
    for n in lengths[3:]:
        assert positions[0, start : start + n].tolist() == list(range(n))
        start += n


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_a_micro_batch_larger_than_the_graphs_shape_is_refused(on_cpu, tiny_megatron_checkpoint, packed):
    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32", pack_sequences=packed)
    micro = varied_batch().select([0, 1, 2]).trimmed()
    small = TrainShape(rows=1, tokens=16) if packed else TrainShape(rows=2, tokens=32)
    with pytest.raises(
        ValueError, match="exceeds the CUDA graphs' .*actor.micro_batch_size x actor.seq_length"
    ):
        actor._host_inputs(micro, small)


def moe_config(**fields):
    """megatron-core's TransformerConfig of a small DeepSeek-V3-like model (layer 0 dense, MLA,
    64 experts top-6, alltoall, bf16, selective recompute of core_attn), with `fields` on top."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    base = {
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_moe_experts": 64,
        "moe_router_topk": 6,
        "moe_layer_freq": [0, 1],
        "moe_ffn_hidden_size": 32,
        "moe_token_dispatcher_type": "alltoall",
        "moe_shared_expert_intermediate_size": 32,
        "moe_router_dtype": "fp32",
        "bf16": True,
        "params_dtype": torch.bfloat16,
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn"],
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
    }
    return MLATransformerConfig(**{**base, **fields})


@pytest.mark.parametrize(
    "modules", [("attn", "moe_router", "moe_preprocess"), ("attn", "mlp", "moe_router"), ("moe_router",)]
)
def test_megatron_core_accepts_the_graph_fields_rlinf_translates(modules):
    from megatron.core.transformer.enums import CudaGraphModule

    fields = cuda_graph_provider(
        ModelConfig(cuda_graph_impl="transformer_engine", cuda_graph_modules=modules)
    )
    config = moe_config(**fields)
    assert config.cuda_graph_impl == "transformer_engine"
    assert config.cuda_graph_modules == [CudaGraphModule[name] for name in modules]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cuda_graph_modules": ["moe"]}, "drop-padding MoE"),
        ({"cuda_graph_modules": ["moe_preprocess"]}, "only supported with moe_router"),
        (
            {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
            "full recompute",
        ),
        ({"recompute_modules": ["moe"]}, "moe recompute is not supported with moe_router"),
    ],
)
def test_what_rlinf_refuses_megatron_core_refuses_too(fields, message):
    """rlinf.config.megatron_graphs refuses these before any worker starts; megatron-core asserts."""
    graphs = cuda_graph_provider(ModelConfig(cuda_graph_impl="transformer_engine"))
    with pytest.raises((AssertionError, ValueError), match=message):
        moe_config(**{**graphs, **fields})
