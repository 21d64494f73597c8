"""Per-GPU memory of each phase of a colocated GRPO step with the Megatron actor and SGLang, computed
from the model's HF config and the recipe (no GPU needed):

    python -m rlinf.models.memory_plan moonlight-16b-grpo-megatron \\
        --hf-config tests/fixtures/moonlight-16b-a3b-config.json

Exact from the code's own sizes: the parameters each rank holds at the recipe's TP / EP / ETP, the
bytes per parameter of its weights, gradient buffer, master weights and Adam moments (the recipe's
dtypes; the distributed optimizer shards the last two over data parallelism), SGLang's
`mem_fraction_static` share, and the weight sync's export bound: the exporter holds at most two
buckets (`rollout.weight_sync_bucket_mb`, or the largest tensor when it is larger; tested in
tests/unit/test_weight_export_streaming.py) and Megatron-Bridge's conversion of one tensor holds its
gathered TP shards plus their concatenation (2 x the largest tensor). Estimated: activations of one
micro-batch. Not counted: CUDA contexts, NCCL buffers, SGLang's CUDA graphs, allocator
fragmentation (7.3 GiB reserved but free in the actor at 12 layers after an offload cycle), and
what a released engine keeps (1.8-3.9 GiB measured on the H200; docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
MIB = 2**20
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
GPU_BYTES = {"H200": 143_771 * MIB, "H100": 81_559 * MIB}  # total memory as nvidia-smi reports it


@dataclass(frozen=True)
class RankParams:
    """Parameters one rank holds, by how they are split."""

    replicated: int  # on every rank: norms, routers, the KV (and Q) down-projections
    tensor_parallel: int  # this rank's TP share: embedding, LM head, attention, dense and shared MLPs
    experts: int  # this rank's routed experts (EP), each split ETP ways

    @property
    def dense(self) -> int:
        return self.replicated + self.tensor_parallel

    @property
    def total(self) -> int:
        return self.dense + self.experts


def rank_params(hf: dict, tp: int = 1, ep: int = 1, etp: int = 1) -> RankParams:
    """What one rank of a DeepSeek-V3-shaped model holds at TP / EP / ETP (PP = 1). The KV
    down-projection is counted whole on every rank (an upper bound: the TE-free spec splits it)."""
    parts = rank_parts(hf, tp, ep, etp).values()
    return RankParams(
        replicated=sum(p.replicated for p in parts),
        tensor_parallel=sum(p.tensor_parallel for p in parts),
        experts=sum(p.experts for p in parts),
    )


def rank_parts(
    hf: dict, tp: int = 1, ep: int = 1, etp: int = 1, *, kv_down_split: bool = False
) -> dict[str, RankParams]:
    """`rank_params` part by part, as megatron-core names the modules: `embedding`,
    `decoder.layers.<i>` (layer 0.. the first `first_k_dense_replace` dense, the rest MoE) and
    `output` (final norm and LM head). `kv_down_split`: the KV down-projection TP-split, as the
    TE-free spec builds it (Transformer Engine's spec keeps it whole on every rank)."""
    h, heads, layers = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    experts = hf.get("n_routed_experts") or 0
    if heads % tp or (experts and experts % ep):
        raise ValueError(f"TP={tp} must divide the {heads} heads and EP={ep} the {experts} routed experts")
    qk_head = hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"]
    kv_lora, q_lora = hf["kv_lora_rank"], hf.get("q_lora_rank")
    kv_down = h * (kv_lora + hf["qk_rope_head_dim"])
    replicated = 2 * h + kv_lora  # 2 norms, KV norm
    split = kv_lora * heads * (hf["qk_nope_head_dim"] + hf["v_head_dim"]) + heads * hf["v_head_dim"] * h
    if kv_down_split:
        split += kv_down
    else:
        replicated += kv_down
    if q_lora:
        replicated += h * q_lora + q_lora
        split += q_lora * heads * qk_head
    else:
        split += h * heads * qk_head
    dense_layers = min(hf.get("first_k_dense_replace", layers), layers) if experts else layers
    moe_i = hf.get("moe_intermediate_size", 0)
    dense = RankParams(replicated, (split + 3 * h * hf["intermediate_size"]) // tp, 0)
    moe = RankParams(
        replicated + experts * h,  # + router
        (split + 3 * h * moe_i * (hf.get("n_shared_experts") or 0)) // tp,
        (experts // ep) * 3 * h * moe_i // etp,
    )
    vocab_shard = hf["vocab_size"] * h // tp
    head = RankParams(h, 0 if hf.get("tie_word_embeddings") else vocab_shard, 0)  # final norm, LM head
    return {
        "embedding": RankParams(0, vocab_shard, 0),
        **{f"decoder.layers.{i}": dense if i < dense_layers else moe for i in range(layers)},
        "output": head,
    }


def largest_tensor_numel(hf: dict) -> int:
    """The largest HF tensor the export yields whole (the embedding or LM head here)."""
    h = hf["hidden_size"]
    return max(
        hf["vocab_size"] * h, hf["intermediate_size"] * h, hf["num_attention_heads"] * hf["v_head_dim"] * h
    )


@dataclass(frozen=True)
class Phase:
    name: str
    actor: float  # bytes on one GPU
    engine: float
    export: float = 0.0

    @property
    def total(self) -> float:
        return self.actor + self.engine + self.export


@dataclass(frozen=True)
class MemoryPlan:
    params: RankParams
    static_actor: float  # weights + gradient buffer + master weights + Adam moments, bytes
    bytes_per_param: dict[str, float]
    activations: float
    engine_static: float  # SGLang's weights + KV pool
    engine_weights: float
    export_peak: float
    phases: list[Phase]


def activation_bytes(hf: dict, tokens: int, tp: int) -> float:
    """Estimate for one micro-batch of `tokens` with sequence parallelism and selective recompute:
    34 x tokens x hidden / TP bytes per layer for the attention block (Korthikanti et al.), each
    token's top-k expert rows (input, fc1 output) on the MoE path, and two fp32 copies of the
    vocabulary-parallel logits."""
    h, layers = hf["hidden_size"], hf["num_hidden_layers"]
    attention = layers * 34 * tokens * h / tp
    moe_layers = layers - hf.get("first_k_dense_replace", layers) if hf.get("n_routed_experts") else 0
    moe = (
        moe_layers
        * tokens
        / tp
        * hf.get("num_experts_per_tok", 0)
        * (2 * h + 4 * hf.get("moe_intermediate_size", 0))
    )
    logits = 2 * tokens * hf["vocab_size"] / tp * 4
    return attention + moe + logits


def memory_plan(cfg, hf: dict, gpu_bytes: float) -> MemoryPlan:
    """The per-GPU memory of each phase for a Megatron + SGLang colocated recipe (`cfg`, a Config)."""
    from rlinf.config.validate import placement_of

    m, o = cfg.actor.model, cfg.actor.optim
    if cfg.actor.training_backend != "megatron":
        raise ValueError(f"actor.training_backend={cfg.actor.training_backend}: the plan is for megatron")
    if m.pipeline_model_parallel_size != 1 or m.context_parallel_size != 1:
        raise ValueError("the plan covers pipeline_model_parallel_size = context_parallel_size = 1 only")
    tp, ep, etp = m.tensor_model_parallel_size, m.expert_model_parallel_size, m.expert_tensor_parallel_size
    gpus = len(placement_of(cfg).gpus["actor"])
    dp, expert_dp = max(gpus // tp, 1), max(gpus // (ep * etp), 1)
    params = rank_params(hf, tp, ep, etp)

    half = m.precision in ("bf16", "fp16")
    weight = DTYPE_BYTES[m.precision]
    grad = DTYPE_BYTES[o.main_grads_dtype] if half else 4
    master = DTYPE_BYTES[o.main_params_dtype] if half else 0
    moments = (
        DTYPE_BYTES[o.exp_avg_dtype] + DTYPE_BYTES[o.exp_avg_sq_dtype]
        if o.use_precision_aware_optimizer
        else 8
    )
    sharded = master + moments  # the distributed optimizer's share of each parameter
    dense_shard, expert_shard = (dp, expert_dp) if o.use_distributed_optimizer else (1, 1)
    static = (weight + grad) * params.total + sharded * (
        params.dense / dense_shard + params.experts / expert_shard
    )

    a = cfg.actor
    tokens = a.max_tokens_per_micro_batch or a.micro_batch_size * a.seq_length
    activations = activation_bytes(hf, tokens, tp)
    # the training estimate at the logprob pass's size: an upper bound, as that pass keeps nothing
    logprob_tokens = a.logprob_max_tokens_per_micro_batch or a.max_tokens_per_micro_batch
    logprob_tokens = logprob_tokens or (a.logprob_micro_batch_size or a.micro_batch_size) * a.seq_length
    engine_static = cfg.rollout.gpu_memory_utilization * gpu_bytes
    engine_weights = DTYPE_BYTES[cfg.rollout.model.precision] * params.total  # its shard, as the actor's
    largest = DTYPE_BYTES[m.precision] * largest_tensor_numel(hf)
    bucket = cfg.rollout.weight_sync_bucket_mb * MIB
    export_peak = 2 * max(bucket, largest) + 2 * largest
    phases = [
        Phase("rollout, actor offloaded", 0, engine_static),
        Phase("rollout, actor resident (auto, when it fits)", static, engine_static),
        Phase("logprob recompute (engine released)", static + activation_bytes(hf, logprob_tokens, tp), 0),
        Phase("train, one micro-batch (engine released)", static + activations, 0),
        Phase("weight sync peak (engine weights resumed)", static, engine_weights, export_peak),
    ]
    return MemoryPlan(
        params=params,
        static_actor=static,
        bytes_per_param={
            "weights": weight,
            "gradients": grad,
            "masters": master / dense_shard,
            "moments": moments / dense_shard,
        },
        activations=activations,
        engine_static=engine_static,
        engine_weights=engine_weights,
        export_peak=export_peak,
        phases=phases,
    )


def format_plan(plan: MemoryPlan, gpu: str, gpu_bytes: float) -> str:
    p = plan.params
    lines = [
        f"per GPU: {p.total / 1e9:.2f} B parameters ({p.experts / 1e9:.2f} B routed experts, "
        f"{p.tensor_parallel / 1e9:.2f} B TP-split, {p.replicated / 1e9:.3f} B replicated)",
        "bytes per parameter: " + ", ".join(f"{k} {v:g}" for k, v in plan.bytes_per_param.items()),
        f"actor static {plan.static_actor / GIB:.1f} GiB; activations (estimate) {plan.activations / GIB:.1f} GiB; "
        f"export peak {plan.export_peak / GIB:.2f} GiB",
        "",
        f"| phase ({gpu}, {gpu_bytes / GIB:.1f} GiB) | actor GiB | SGLang GiB | export GiB | total GiB | share |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for ph in plan.phases:
        lines.append(
            f"| {ph.name} | {ph.actor / GIB:.1f} | {ph.engine / GIB:.1f} | {ph.export / GIB:.2f} | "
            f"{ph.total / GIB:.1f} | {ph.total / gpu_bytes:.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="moonlight-16b-grpo-megatron")
    parser.add_argument("--hf-config", required=True, help="the model's config.json")
    parser.add_argument(
        "--gpu",
        action="append",
        choices=list(GPU_BYTES),
        help="one GPU's table (repeatable; default: every GPU's)",
    )
    parser.add_argument("overrides", nargs="*", default=[], help="recipe overrides (Hydra syntax)")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    from rlinf.config import ConfigError, load_config

    try:
        hf = json.loads(Path(args.hf_config).read_text())
    except (OSError, ValueError) as err:
        print(f"memory_plan: {args.hf_config}: unreadable HF config: {err}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.recipe, args.overrides)
        tables = [
            format_plan(memory_plan(cfg, hf, GPU_BYTES[g]), g, GPU_BYTES[g]) for g in args.gpu or GPU_BYTES
        ]
    except KeyError as err:
        print(f"memory_plan: {args.hf_config}: no field {err} (not a DeepSeek-V3 config?)", file=sys.stderr)
        return 2
    except (ValueError, ConfigError) as err:
        print(f"memory_plan: {args.recipe}: {err}", file=sys.stderr)
        return 2
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
