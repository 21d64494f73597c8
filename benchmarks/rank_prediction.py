"""The user's per-GPU actor time per GRPO step, from one emulated rank (benchmarks/rank_emulation.py).

The emulated rank measures one rank's GPU work and host work at the recipe's layout, without the
collectives. The prediction (docs/moonlight.md, section 6):

    per-GPU actor time per step = sequences per step per rank
        x (forward / backward + logprob seconds per sequence, measured)
        + optimizer steps per step x seconds per optimizer step, measured
        + micro-batches per step per rank x collective seconds per micro-batch, estimated
          (bytes / link bandwidth + count x latency)

Sequences per step per rank: rollout_batch_size x group_size / data-parallel size; micro-batches:
that over the benchmark's micro-batch size; optimizer steps: that over actor.global_batch_size / data-parallel
size (the benchmark's train call steps once, so its optimizer phase is timed apart). The collectives are assumed not to overlap compute (megatron-core's TP
communication overlap is off in the recipe), each moving over NVLink at `LinkAssumption` rates.
Bytes one rank receives per micro-batch of T tokens (bf16, W = TP ranks, f = (W - 1) / W), forward:

- attention (sequence parallel): all-gather of the hidden states before the Q projection (T x h),
  of the compressed KV and RoPE key (T x (kv_lora_rank + rope dim)), reduce-scatter after the
  output projection (T x h);
- dense MLP and shared experts: all-gather T x h before fc1, reduce-scatter T x h after fc2;
- routed experts: all-to-all dispatch and combine, T/W x top_k rows of h each way, (EP - 1) / EP
  of them leaving the rank;
- embedding: reduce-scatter T x h; LM head: all-gather T x h.

The backward moves the same bytes (each all-gather's gradient is a reduce-scatter and back), so a
train micro-batch moves 2x the forward's bytes and a logprob micro-batch 1x. Small collectives
(token counts, vocabulary-parallel softmax sums) count towards `count` only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rlinf.models.memory_plan import rank_parts

BF16 = 2


@dataclass(frozen=True)
class LinkAssumption:
    """How fast a collective moves on the user's node: assumptions, not measurements."""

    gbps: float = 350.0  # GB/s one GPU receives (H200 NVLink: 450 GB/s each way; NCCL reaches ~3/4 of it)
    latency_us: float = 20.0  # per collective, the launch and NCCL's protocol latency


def rank_flops_per_token(hf: dict, tp: int, ep: int, etp: int, context: float) -> float:
    """Model FLOPs one rank does per token of its micro-batch (forward + backward, 6 per weight a
    token meets): its TP shards on all T tokens, its replicated weights (KV down-projection,
    router, norms) on its T/TP sequence-parallel chunk, its experts on T x top_k / EP rows, causal
    attention over its heads. Summed over the TP ranks this is the whole model's count."""
    k, experts = hf.get("num_experts_per_tok", 0), hf.get("n_routed_experts") or 1
    weights = sum(
        p.tensor_parallel + p.replicated / tp + p.experts * k / experts
        for name, p in rank_parts(hf, tp, ep, etp).items()
        if name != "embedding"  # a lookup, not a GEMM
    )
    heads = hf["num_attention_heads"] // tp
    qk_v = hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"] + hf["v_head_dim"]
    return 6 * weights + 6 * hf["num_hidden_layers"] * heads * qk_v * context / 2


def collectives_per_micro_batch(hf: dict, tokens: int, tp: int, ep: int) -> dict:
    """Forward bytes one rank receives, and the number of collectives, for a `tokens`-token
    micro-batch (module docstring)."""
    if tp == 1 and ep == 1:
        return {"bytes": 0.0, "count": 0}
    h, layers = hf["hidden_size"], hf["num_hidden_layers"]
    dense_layers = (
        min(hf.get("first_k_dense_replace", layers), layers) if hf.get("n_routed_experts") else layers
    )
    f = (tp - 1) / tp
    attention = (
        f * tokens * (2 * h + (hf.get("q_lora_rank") or 0) + hf["kv_lora_rank"] + hf["qk_rope_head_dim"])
    )
    mlp = f * tokens * 2 * h
    dispatch = 2 * (ep - 1) / ep * tokens / tp * hf.get("num_experts_per_tok", 0) * h
    moe_layers = layers - dense_layers
    width = layers * attention + dense_layers * mlp + moe_layers * (mlp + dispatch) + 2 * f * tokens * h
    count = layers * 3 + dense_layers * 2 + moe_layers * 6 + 2 + 3  # + embedding, LM head, softmax sums
    return {"bytes": BF16 * width, "count": count}


def _data_parallel_size(cfg) -> int:
    from rlinf.config.validate import actor_data_parallel_size

    return max(actor_data_parallel_size(cfg), 1)


def sequences_per_step(cfg) -> int:
    """Sequences one rank trains (and recomputes logprobs for) per GRPO step of recipe `cfg`:
    rollout_batch_size x group_size over the data-parallel ranks."""
    return -(-cfg.data.rollout_batch_size * cfg.algorithm.group_size // _data_parallel_size(cfg))


def optimizer_sequences_per_step(cfg) -> int:
    """Sequences one rank trains per optimizer step: actor.global_batch_size over the data-parallel
    ranks."""
    return max(cfg.actor.global_batch_size // _data_parallel_size(cfg), 1)


def predict_actor_step(
    cfg,
    hf: dict,
    *,
    train_call_s: float,
    logprob_call_s: float,
    optimizer_step_s: float = 0.0,
    sequences_per_call: int,
    sequences_per_micro_batch: int,
    tokens_per_micro_batch: int,
    logprob_sequences_per_micro_batch: int | None = None,
    link: LinkAssumption = LinkAssumption(),
) -> dict:
    """The per-GPU actor seconds of one GRPO step of recipe `cfg` (module docstring), from the
    emulated rank's measured train and logprob calls over `sequences_per_call` sequences (a train
    call steps the optimizer once, in `optimizer_step_s` of its time; the recipe steps it once per
    actor.global_batch_size sequences over the data-parallel ranks), in train
    micro-batches of `sequences_per_micro_batch` (`tokens_per_micro_batch` tokens) and logprob
    forwards of `logprob_sequences_per_micro_batch` sequences (default: the train micro-batch's).
    A logprob forward of more sequences moves the same bytes in fewer, larger collectives."""
    m = cfg.actor.model
    sequences = sequences_per_step(cfg)
    tokens_per_sequence = tokens_per_micro_batch / sequences_per_micro_batch
    logprob_rows = logprob_sequences_per_micro_batch or sequences_per_micro_batch

    def forward_comm(rows: int) -> dict:
        return collectives_per_micro_batch(
            hf, round(rows * tokens_per_sequence), m.tensor_model_parallel_size, m.expert_model_parallel_size
        )

    def seconds(comm: dict) -> float:
        return comm["bytes"] / (link.gbps * 1e9) + comm["count"] * link.latency_us * 1e-6

    micro_batches = -(-sequences // sequences_per_micro_batch)
    logprob_forwards = -(-sequences // logprob_rows)
    comm = forward_comm(sequences_per_micro_batch)
    train_comm_s = micro_batches * 2 * seconds(comm)
    logprob_comm_s = logprob_forwards * seconds(forward_comm(logprob_rows))
    optimizer_steps = -(-sequences // optimizer_sequences_per_step(cfg))
    passes_s = train_call_s - optimizer_step_s  # the call's forward / backward passes
    train_s = sequences * passes_s / sequences_per_call + optimizer_steps * optimizer_step_s + train_comm_s
    logprob_s = sequences * logprob_call_s / sequences_per_call + logprob_comm_s
    return {
        "sequences_per_step_per_rank": sequences,
        "micro_batches_per_step_per_rank": micro_batches,
        "optimizer_steps_per_step": optimizer_steps,
        "logprob_forwards_per_step_per_rank": logprob_forwards,
        "tokens_per_micro_batch": tokens_per_micro_batch,
        "collective_gib_per_train_micro_batch": 2 * comm["bytes"] / 2**30,
        "collectives_per_train_micro_batch": 2 * comm["count"],
        "collective_s_per_step": train_comm_s + logprob_comm_s,
        "train_s_per_step": train_s,
        "logprob_s_per_step": logprob_s,
        "actor_s_per_step": train_s + logprob_s,
        "link_assumption": asdict(link),
    }
