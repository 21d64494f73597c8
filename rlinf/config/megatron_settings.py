"""Recipe -> Megatron settings: provider fields, DDP config and optimizer config, as plain data.

Pure: imports neither torch nor megatron, so config validation and CPU tests use it. The actor
(rlinf.workers.actor.megatron_actor) applies `provider` with setattr on the Megatron-Bridge
provider before `finalize()`, and builds megatron-core's DistributedDataParallelConfig and
OptimizerConfig from `ddp` and `optimizer` (dtype values are torch dtype NAMES, e.g. "bfloat16").

What RL needs that the DeepSeek-V3 bridge sets differently (megatron-bridge 0.6.2):
- MoE: aux loss 0 and no load-balancing loss (the reward is the only objective), routing-bias
  update rate from the recipe (0 for RL: the rollout engine routes with the frozen bias too),
  router in fp32, the alltoall dispatcher; megatron's grouped GEMM (TEGroupedMLP) whenever
  Transformer Engine is there. Without TE megatron's local backend has SequentialMLP experts only;
  `actor.model.moe_grouped_gemm` then selects rlinf's grouped-GEMM experts in the TE-free spec.
  `actor.model.moe_grouped_gemm_impl: torch` selects rlinf's experts in the TE spec too
  (`MegatronSettings.grouped_experts`, rlinf.models.megatron.grouped_experts).
- No MTP layers (RL neither runs nor trains them).
- With TE (docs/megatron.md, "Transformer Engine"): grouped-GEMM experts, fused token permute /
  unpermute, and gradient-accumulation fusion in the TE layers (megatron's own output layer would
  need apex for it: rlinf.models.megatron.bridge.te_wgrad_fusion_without_apex builds it unfused),
  and megatron-core's fused MLA RoPE (its triton kernels for YaRN RoPE: the bridge gives Moonlight's
  plain RoPE as YaRN with scaling factor 1, the same rotation).
- Without TE: gradient-accumulation, cross-entropy, permute and layer-norm fusions off (they are TE
  or apex kernels), and `transformer_impl = "local"`.
- Per-layer CUDA graphs of the train pass when the recipe asks (rlinf.config.megatron_graphs).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

from rlinf.config.megatron_graphs import cuda_graph_problems, cuda_graph_provider
from rlinf.config.schema import ActorConfig, ModelConfig, OptimConfig
from rlinf.config.typed import ConfigError

MASTER_DTYPES = ("fp32", "fp16")  # megatron-core / TE FusedAdam accept only these master params
MOMENT_DTYPES = ("fp32", "fp16", "bf16", "fp8")
TE_FREE_MOMENT_DTYPES = ("fp32", "bf16")  # rlinf's CompactAdamW (rlinf.models.megatron.compact_adamw)
GRAD_DTYPES = ("fp32", "bf16")
# Fraction bits of the low-precision moment formats TE's FusedAdam stores (its FP8 is E4M3).
MOMENT_FRACTION_BITS = {"fp16": 10, "bf16": 7, "fp8": 3}
TORCH_DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "uint8"}
RECOMPUTE_GRANULARITIES = (None, "selective", "full")
SELECTIVE_RECOMPUTE_MODULES = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
)


class MegatronSettingsError(ConfigError):
    """A recipe asks for a Megatron setting that cannot work; the message names the key. Raised on
    the actor's workers too (what Transformer Engine's presence decides): a config error there."""


@dataclass(frozen=True)
class MegatronSettings:
    provider: dict[str, Any]  # attribute -> value on the bridge's model provider
    ddp: dict[str, Any]  # DistributedDataParallelConfig keyword arguments
    optimizer: dict[str, Any]  # OptimizerConfig keyword arguments
    # routed experts as rlinf's GroupedGemmExperts (torch grouped_mm), not TEGroupedMLP / SequentialMLP
    grouped_experts: bool = False
    # TE-free precision-aware optimizer: megatron's AdamW swapped for rlinf's CompactAdamW, with
    # (exp_avg, exp_avg_sq) stored in these dtypes ("fp32"/"bf16"); None keeps megatron's own
    compact_moments: tuple[str, str] | None = None
    warnings: tuple[str, ...] = field(default=())  # what was changed from the recipe and why


def precision_problems(optim: OptimConfig) -> list[str]:
    """One message per impossible optimizer-precision setting (empty when all is well)."""
    problems = []
    if optim.main_params_dtype not in MASTER_DTYPES:
        problems.append(
            f"actor.optim.main_params_dtype: {optim.main_params_dtype!r} is not offered by megatron-core; "
            f"master weights are one of {', '.join(MASTER_DTYPES)} (there are no bf16 or FP8 master "
            "weights: small updates would round away). Use fp32, with bf16 or fp8 moments "
            "(exp_avg_dtype / exp_avg_sq_dtype) to save memory"
        )
    for key in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        value = getattr(optim, key)
        if value not in MOMENT_DTYPES:
            problems.append(f"actor.optim.{key}: {value!r}; one of {', '.join(MOMENT_DTYPES)}")
    if optim.main_grads_dtype not in GRAD_DTYPES:
        problems.append(
            f"actor.optim.main_grads_dtype: {optim.main_grads_dtype!r}; one of {', '.join(GRAD_DTYPES)}"
        )
    low = [
        k
        for k in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
        if getattr(optim, k) != "fp32" and getattr(optim, k) in MASTER_DTYPES + MOMENT_DTYPES
    ]
    if low and not optim.use_precision_aware_optimizer:
        problems.append(
            f"actor.optim.{low[0]}: {getattr(optim, low[0])} needs use_precision_aware_optimizer: true "
            "(without it megatron-core keeps every optimizer state in fp32)"
        )
    if optim.use_precision_aware_optimizer and not optim.use_distributed_optimizer:
        problems.append(
            "actor.optim.use_precision_aware_optimizer: needs use_distributed_optimizer: true (megatron-core)"
        )
    return problems


def te_free_optimizer_problems(optim: OptimConfig) -> list[str]:
    """What the precision-aware optimizer cannot do without Transformer Engine's FusedAdam."""
    if not optim.use_precision_aware_optimizer:
        return []
    problems = []
    if optim.main_params_dtype != "fp32":
        problems.append(
            f"actor.optim.main_params_dtype: {optim.main_params_dtype} master weights need Transformer "
            "Engine's FusedAdam, which is not installed; use fp32 (bf16 moments still save memory)"
        )
    for key in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        value = getattr(optim, key)
        if value not in TE_FREE_MOMENT_DTYPES:
            problems.append(
                f"actor.optim.{key}: {value} moments need Transformer Engine's FusedAdam, which is not "
                f"installed; without it: one of {', '.join(TE_FREE_MOMENT_DTYPES)} (rlinf's CompactAdamW)"
            )
    return problems


def _as_fp32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _round_to_fraction_bits(x: float, bits: int) -> float:
    """Positive `x` rounded to nearest, ties to even, with `bits` fraction bits (a cast to the format)."""
    mantissa, exponent = math.frexp(x)  # 0.5 <= mantissa < 1
    scale = 2.0 ** (bits + 1)
    return math.ldexp(round(mantissa * scale) / scale, exponent)


def decay_rounds_away(dtype: str, beta: float) -> bool:
    """Whether `beta x moment`, computed in fp32 and stored in `dtype` rounded to nearest (as TE's
    FusedAdam does), gives back the moment itself for some value: a binade's every significand tried."""
    bits = MOMENT_FRACTION_BITS.get(dtype)
    if bits is None:
        return False
    beta32 = _as_fp32(beta)
    significands = (1.0 + k * 2.0**-bits for k in range(2**bits))
    return any(_round_to_fraction_bits(_as_fp32(beta32 * m), bits) == m for m in significands)


def decaying_beta_bound(dtype: str) -> float:
    """A beta every value of `dtype` decays at: its decay, (1 - beta) of the value, is then at least
    half the format's spacing (2^-(p+1) of the value for p fraction bits), or crosses into the finer
    binade below."""
    return 1.0 - 2.0 ** -(MOMENT_FRACTION_BITS[dtype] + 1)


def rounded_moment_problems(optim: OptimConfig) -> list[str]:
    """Transformer Engine's FusedAdam (the precision-aware optimizer with TE) stores a low-precision
    moment rounded to nearest. Where the moment's per-step decay is finer than the format's spacing,
    `beta x moment` rounds back to the moment: it stops decaying and only grows, on the gradients
    large enough to move it. With bf16 and beta2 = 0.999 (a 1e-3 decay against half-spacings of 2-4e-3)
    the second moment never decays and the effective learning rate falls over training. Without TE,
    rlinf's CompactAdamW rounds stochastically, which keeps the decay in expectation."""
    if not optim.use_precision_aware_optimizer:
        return []
    problems = []
    for key, beta_key in (("exp_avg_dtype", "adam_beta1"), ("exp_avg_sq_dtype", "adam_beta2")):
        dtype, beta = getattr(optim, key), getattr(optim, beta_key)
        if decay_rounds_away(dtype, beta):
            problems.append(
                f"actor.optim.{key}: {dtype} with {beta_key} {beta}: Transformer Engine's FusedAdam "
                f"stores this moment rounded to nearest {dtype}, whose spacing is coarser than its "
                f"per-step decay (1 - {beta_key} = {1 - beta:.3g}), so the moment stops decaying and "
                f"the effective learning rate falls over training; use {key}: fp32, or "
                f"{beta_key} <= {decaying_beta_bound(dtype):.6g}"
            )
    return problems


def model_problems(actor: ActorConfig, *, te_available: bool) -> list[str]:
    m = actor.model
    problems = []
    if m.pipeline_model_parallel_size != 1:
        problems.append(
            "actor.model.pipeline_model_parallel_size: this actor runs pipeline parallel size 1 only "
            f"(got {m.pipeline_model_parallel_size}); use tensor / expert parallelism"
        )
    if m.context_parallel_size != 1:
        problems.append(
            f"actor.model.context_parallel_size: {m.context_parallel_size}; this actor runs context parallel "
            "size 1 only (it does not split sequences over CP ranks); use tensor / expert parallelism"
        )
    if not m.multi_latent_attention:
        problems.append("actor.model.multi_latent_attention: DeepSeek-V3 / Moonlight checkpoints are MLA")
    if m.recompute_granularity not in RECOMPUTE_GRANULARITIES:
        problems.append(
            f"actor.model.recompute_granularity: {m.recompute_granularity!r}; one of null, selective, full"
        )
    unknown = [name for name in m.recompute_modules if name not in SELECTIVE_RECOMPUTE_MODULES]
    if unknown:
        problems.append(
            f"actor.model.recompute_modules: unknown {unknown}; choose from {', '.join(SELECTIVE_RECOMPUTE_MODULES)}"
        )
    if m.moe_token_dispatcher_type not in ("alltoall", "allgather"):
        problems.append(
            f"actor.model.moe_token_dispatcher_type: {m.moe_token_dispatcher_type!r}; alltoall or allgather "
            "(flex needs DeepEP / HybridEP)"
        )
    problems += expert_problems(m, te_available=te_available)
    problems += cuda_graph_problems(actor, te_available=te_available)
    if m.tensor_model_parallel_size > 1 and not m.sequence_parallel:
        problems.append(
            "actor.model.sequence_parallel: must be true for MoE with tensor_model_parallel_size > 1"
        )
    return problems


def torch_grouped_experts(m: ModelConfig, *, te_available: bool) -> bool:
    """Whether the routed experts are rlinf's GroupedGemmExperts (torch grouped_mm): asked for by
    name, or `auto` without Transformer Engine with moe_grouped_gemm on."""
    if m.moe_grouped_gemm_impl == "auto":
        return m.moe_grouped_gemm and not te_available
    return m.moe_grouped_gemm_impl == "torch"


def expert_problems(m: ModelConfig, *, te_available: bool) -> list[str]:
    """What the routed-experts choice (moe_grouped_gemm, moe_grouped_gemm_impl) cannot run."""
    impl = m.moe_grouped_gemm_impl
    if impl == "transformer_engine" and not te_available:
        return [
            "actor.model.moe_grouped_gemm_impl: transformer_engine needs Transformer Engine, which is not "
            "installed; use auto or torch"
        ]
    if impl == "torch" and not te_available and not m.moe_grouped_gemm:
        return [
            "actor.model.moe_grouped_gemm_impl: torch with moe_grouped_gemm: false; without Transformer "
            "Engine moe_grouped_gemm: false selects megatron's SequentialMLP, so set one of the two"
        ]
    if torch_grouped_experts(m, te_available=te_available) and m.expert_tensor_parallel_size != 1:
        key = "moe_grouped_gemm_impl" if impl == "torch" else "moe_grouped_gemm"
        return [
            f"actor.model.{key}: rlinf's grouped-GEMM experts have no expert tensor parallelism "
            f"(expert_tensor_parallel_size = {m.expert_tensor_parallel_size}); use 1, or "
            + ("moe_grouped_gemm_impl: transformer_engine" if impl == "torch" else "moe_grouped_gemm: false")
        ]
    return []


def recompute_modules(
    modules, granularity: str | None, keeps_moe_act: bool, warnings: list[str]
) -> list[str] | None:
    """Selective recompute's module list. `moe_act` is recomputed by TE's grouped-GEMM experts
    (TEGroupedMLP) and by rlinf's GroupedGemmExperts, but megatron-core accepts it only with its own
    grouped-GEMM flag, which follows Transformer Engine ("only supported with moe_grouped_gemm").
    Without TE (`keeps_moe_act` false) it is dropped, with a warning, instead of failing the run."""
    if granularity != "selective":
        return None
    kept = list(modules)
    if not keeps_moe_act and "moe_act" in kept:
        kept.remove("moe_act")
        warnings.append(
            "actor.model.recompute_modules: moe_act is recomputed only where Transformer Engine is "
            "installed (megatron-core asks for its grouped-GEMM flag); the experts' activations are kept "
            f"(recomputing {kept or 'nothing'})"
        )
    return kept


def translate(actor: ActorConfig, *, te_available: bool) -> MegatronSettings:
    """The Megatron settings for a recipe's actor section; raises MegatronSettingsError when impossible."""
    problems = model_problems(actor, te_available=te_available) + precision_problems(actor.optim)
    if not problems:
        optim = actor.optim
        problems = rounded_moment_problems(optim) if te_available else te_free_optimizer_problems(optim)
    if problems:
        raise MegatronSettingsError("\n".join(problems))
    warnings: list[str] = []
    m, o = actor.model, actor.optim
    grouped_experts = torch_grouped_experts(m, te_available=te_available)
    bf16, fp16 = m.precision == "bf16", m.precision == "fp16"
    provider: dict[str, Any] = {
        "tensor_model_parallel_size": m.tensor_model_parallel_size,
        "pipeline_model_parallel_size": m.pipeline_model_parallel_size,
        "expert_model_parallel_size": m.expert_model_parallel_size,
        "expert_tensor_parallel_size": m.expert_tensor_parallel_size,
        "context_parallel_size": m.context_parallel_size,
        "sequence_parallel": m.sequence_parallel,
        "seq_length": actor.seq_length,
        "bf16": bf16,
        "fp16": fp16,
        "params_dtype": TORCH_DTYPE_NAMES[m.precision],
        "pipeline_dtype": TORCH_DTYPE_NAMES[m.precision],
        "moe_token_dispatcher_type": m.moe_token_dispatcher_type,
        "moe_router_dtype": "fp32",
        "moe_aux_loss_coeff": 0.0,
        "moe_router_load_balancing_type": "none",
        "moe_router_bias_update_rate": m.moe_router_bias_update_rate,
        "moe_grouped_gemm": te_available,
        "moe_permute_fusion": te_available,
        "mtp_num_layers": None,
        "gradient_accumulation_fusion": te_available,
        "apply_rope_fusion": te_available,
        "recompute_granularity": m.recompute_granularity,
        "recompute_modules": recompute_modules(
            m.recompute_modules, m.recompute_granularity, te_available, warnings
        ),
        "recompute_method": "uniform" if m.recompute_granularity == "full" else None,
        "recompute_num_layers": 1 if m.recompute_granularity == "full" else None,
        # Logits come back in the compute dtype; logprobs.py upcasts chunk by chunk.
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        **cuda_graph_provider(m),
    }
    if not te_available:
        provider.update(
            {
                "transformer_impl": "local",
                "cross_entropy_fusion_impl": "native",
                "cross_entropy_loss_fusion": False,
                "persist_layer_norm": False,
                "moe_shared_expert_overlap": False,
                "masked_softmax_fusion": False,
            }
        )
    ddp = {
        "grad_reduce_in_fp32": o.main_grads_dtype == "fp32",
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
        "use_distributed_optimizer": o.use_distributed_optimizer,
        "check_for_nan_in_grad": False,  # the update loop skips non-finite steps itself, on every rank
        "average_in_collective": False,
    }
    # Without TE, megatron-core keeps its fp32 path (fp32 master shards, main grads as configured by
    # the DDP buffer) and rlinf's CompactAdamW stores the moments in bf16 (docs/megatron.md, "Precision").
    precision_aware = o.use_precision_aware_optimizer and te_available
    moments = (o.exp_avg_dtype, o.exp_avg_sq_dtype)
    compact = o.use_precision_aware_optimizer and not te_available and moments != ("fp32", "fp32")
    optimizer = {
        "optimizer": "adam",
        "lr": o.lr,
        "min_lr": o.lr,
        "weight_decay": o.weight_decay,
        "adam_beta1": o.adam_beta1,
        "adam_beta2": o.adam_beta2,
        "adam_eps": o.adam_eps,
        "clip_grad": o.clip_grad,
        "bf16": bf16,
        "fp16": fp16,
        "params_dtype": TORCH_DTYPE_NAMES[m.precision],
        "use_distributed_optimizer": o.use_distributed_optimizer,
        "use_precision_aware_optimizer": precision_aware,
        "main_params_dtype": TORCH_DTYPE_NAMES[o.main_params_dtype if precision_aware else "fp32"],
        "main_grads_dtype": TORCH_DTYPE_NAMES[o.main_grads_dtype if precision_aware else "fp32"],
        "exp_avg_dtype": TORCH_DTYPE_NAMES[o.exp_avg_dtype if precision_aware else "fp32"],
        "exp_avg_sq_dtype": TORCH_DTYPE_NAMES[o.exp_avg_sq_dtype if precision_aware else "fp32"],
    }
    if fp16:
        optimizer.update({"loss_scale": None, "initial_loss_scale": 2.0**16})
    return MegatronSettings(
        provider=provider,
        ddp=ddp,
        optimizer=optimizer,
        grouped_experts=grouped_experts,
        compact_moments=moments if compact else None,
        warnings=tuple(warnings),
    )
