"""actor.model.cuda_graph_impl / cuda_graph_modules as plain data: the provider fields, the fixed
micro-batch shape the graphs are captured for, and what cannot run. Pure (no torch, no megatron).

megatron-core 0.19.2 captures, per decoder layer, one forward and one backward graph of the listed
parts with Transformer Engine's make_graphed_callables (transformer/cuda_graphs.py,
TECudaGraphHelper); rlinf.models.megatron.cuda_graphs runs that. What it asks of the recipe:

- one input shape for every training micro-batch, [tokens / TP under SP, rows, hidden], in bf16
  (its dummy capture inputs are bf16): the actor pads every micro-batch to `fixed_train_shape`;
- Transformer Engine (the helper and the graph-safe RNG tracker are TE's);
- no full recompute, and no `moe` recompute when the router is graphed (transformer_config.py
  asserts both);
- no packed THD attention: a graphed attention takes no PackedSeqParams (transformer_layer.py
  `_te_cuda_graph_replay`); packed micro-batches run with the attention eager;
- the `moe` scope (the whole MoE layer) needs drop-and-pad experts, which drop tokens: the rollout
  engine drops none, so it is not offered; an empty list (the whole layer) would graph it too;
- megatron replays the graphs only in training mode: the logprob pass stays eager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlinf.config.schema import ActorConfig, Config, ModelConfig

GRAPH_MODULES = ("attn", "mlp", "moe_router", "moe_preprocess")


@dataclass(frozen=True)
class TrainShape:
    """The one micro-batch shape the graphs are captured for: `rows` rows of `tokens` tokens."""

    rows: int
    tokens: int


def graphs_on(m: ModelConfig) -> bool:
    return m.cuda_graph_impl == "transformer_engine"


def sequence_multiple(m: ModelConfig) -> int:
    """Sequence parallelism splits the tokens over the TP ranks: a length must divide by TP."""
    return m.tensor_model_parallel_size if m.sequence_parallel else 1


def fixed_train_shape(actor: ActorConfig) -> TrainShape | None:
    """micro_batch_size rows of seq_length tokens; packed, one row of max_tokens_per_micro_batch
    tokens (micro_batch_size x seq_length without a budget); rounded up to the TP multiple under
    sequence parallelism. None without graphs (micro-batches keep their trimmed shape)."""
    m = actor.model
    if not graphs_on(m):
        return None
    if actor.pack_sequences:
        rows, tokens = 1, actor.max_tokens_per_micro_batch or actor.micro_batch_size * actor.seq_length
    else:
        rows, tokens = actor.micro_batch_size, actor.seq_length
    multiple = sequence_multiple(m)
    return TrainShape(rows, -(-tokens // multiple) * multiple)


def cuda_graph_problems(actor: ActorConfig, *, te_available: bool) -> list[str]:
    """One message per combination the graphs cannot run (empty when all is well)."""
    m = actor.model
    modules = list(m.cuda_graph_modules)
    if not graphs_on(m):
        if tuple(modules) != ModelConfig().cuda_graph_modules:
            return [
                "actor.model.cuda_graph_modules: set, but actor.model.cuda_graph_impl is none (no graphs); "
                "set cuda_graph_impl: transformer_engine, or remove the key"
            ]
        return []
    where = "actor.model.cuda_graph_impl: transformer_engine"
    problems = []
    unknown = [name for name in modules if name not in GRAPH_MODULES]
    if "moe" in unknown:
        problems.append(
            "actor.model.cuda_graph_modules: moe graphs the whole MoE layer, which megatron-core allows only "
            "with drop-and-pad experts (they drop tokens the rollout engine keeps); use moe_router and "
            "moe_preprocess"
        )
    elif unknown:
        problems.append(
            f"actor.model.cuda_graph_modules: unknown {unknown}; choose from {', '.join(GRAPH_MODULES)}"
        )
    if not modules:
        problems.append(
            "actor.model.cuda_graph_modules: empty would graph whole layers, MoE dispatch included (its "
            f"token counts go to the host); list the parts: {', '.join(GRAPH_MODULES)}"
        )
    if "moe_preprocess" in modules and "moe_router" not in modules:
        problems.append("actor.model.cuda_graph_modules: moe_preprocess needs moe_router (megatron-core)")
    if not te_available:
        problems.append(
            f"{where} needs Transformer Engine, which is not installed (or RLINF_MEGATRON_TE=off); "
            "use cuda_graph_impl: none"
        )
    if m.precision != "bf16":
        problems.append(
            f"{where} needs actor.model.precision: bf16 (megatron-core captures the graphs on bf16 "
            f"inputs); got {m.precision}"
        )
    if m.recompute_granularity == "full":
        problems.append(
            f"{where} cannot run with actor.model.recompute_granularity: full (megatron-core allows full "
            "recompute only with whole-iteration graphs); use selective"
        )
    if m.recompute_granularity == "selective" and "moe" in m.recompute_modules and "moe_router" in modules:
        problems.append(
            f"{where}: actor.model.recompute_modules moe cannot run with the moe_router graph "
            "(megatron-core); drop moe from recompute_modules or moe_router from cuda_graph_modules"
        )
    if actor.pack_sequences and "attn" in modules:
        problems.append(
            "actor.model.cuda_graph_modules: attn cannot run with actor.pack_sequences (a graphed "
            "attention takes no packed THD sequences); drop attn, or set pack_sequences: false"
        )
    if actor.max_tokens_per_micro_batch is not None and not actor.pack_sequences:
        problems.append(
            f"{where} needs one micro-batch shape; actor.max_tokens_per_micro_batch varies the rows of "
            "a padded micro-batch: set it null (micro_batch_size rows) or set actor.pack_sequences: true"
        )
    return problems


def routing_replay_problem(cfg: Config) -> str | None:
    """Routing replay sets each router's targets per micro-batch from the host, and a graphed
    router (or a padded micro-batch's extra rows) would not see them."""
    mode = cfg.algorithm.routing_replay.mode
    if cfg.actor.training_backend != "megatron" or not graphs_on(cfg.actor.model) or mode == "none":
        return None
    return (
        f"actor.model.cuda_graph_impl: transformer_engine cannot run with algorithm.routing_replay.mode: "
        f"{mode} (the replayed experts are set per micro-batch from the host, outside the graphs); "
        "set cuda_graph_impl: none or routing_replay.mode: none"
    )


def cuda_graph_provider(m: ModelConfig) -> dict[str, Any]:
    """The provider fields of the graphs (none without them)."""
    if not graphs_on(m):
        return {}
    return {
        "cuda_graph_impl": "transformer_engine",
        "cuda_graph_modules": list(m.cuda_graph_modules),
        "use_te_rng_tracker": True,  # Megatron-Bridge asserts it with graphs: TE's tracker is graph-safe
        # Megatron-LM trains this many steps eagerly before it captures, and TE then warms each layer
        # up until 10 passes are reached; the actor captures before its first step, so TE does all 10
        # (a recapture after an onload counts the first one's: rlinf.models.megatron.cuda_graphs).
        "cuda_graph_warmup_steps": 0,
        # The bridge overlaps the shared experts with the token dispatch: their forward is started
        # in the dispatcher's preprocess and finished after the routed experts. A captured
        # preprocess starts it on every warm-up pass and never finishes it (megatron asserts on the
        # second start); without the overlap the shared experts run beside the router, inside its
        # graph.
        "moe_shared_expert_overlap": False,
    }
