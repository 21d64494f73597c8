"""Transformer Engine layer spec for DeepSeek-V3 / Moonlight (MLA + MoE): megatron-core's own TE
decoder block spec with one adjustment, for checkpoints without a query LoRA (`q_lora_rank: null`,
Moonlight's case).

The HF model normalises once before attention (`input_layernorm`) and feeds that to both `q_proj`
and the compressed-KV path (`kv_a_proj_with_mqa`, then `kv_a_layernorm`). megatron-core 0.19's TE
spec keeps `input_layernorm` as a standalone TE RMSNorm, but its MLA norm resolver
(`transformer/mla_qk_norm_config.py`) turns on `qk_layernorm` for the KV norm and then also makes
`linear_q_proj` a fused norm + linear (`TELayerNormColumnParallelLinear`): a SECOND, trainable RMSNorm
on the q path that HF does not have. megatron-bridge 0.6.2 has no HF tensor for its weight
(`linear_q_proj.layer_norm_weight`), so the load crashes; a mapping from `input_layernorm.weight`
would normalise twice. Upstream: Megatron-Bridge issues 5261 (the extra Q norm) and 5294 (the same
gap seen as an unmapped norm).

`TEMLASelfAttention` keeps megatron-core's resolution everywhere except there: with no query LoRA,
`linear_q_proj` is the spec's plain TE column-parallel linear. Result, as in HF: one RMSNorm
(`input_layernorm`) before `linear_q_proj` and `linear_kv_down_proj`, the KV norm fused into
`linear_kv_up_proj` (`layer_norm_weight` <- `kv_a_layernorm.weight`), and every parameter named as
the bridge's DeepSeek mapping expects, so export gives HF's names back unchanged.

The TE-free fallback (rlinf.models.megatron.spec) resolves the same projections explicitly for
megatron's local backend.
"""

from __future__ import annotations

import copy

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mla_qk_norm_config import QKNormConfigResolver
from megatron.core.transformer.multi_latent_attention import MLASelfAttention

from rlinf.models.megatron.grouped_experts import use_grouped_experts

SPEC_NAME = "transformer_engine"


def resolve_te_mla_projections(config, submodules) -> dict:
    """megatron-core's MLA projection / norm resolution, except that without a query LoRA the query
    projection stays the spec's plain linear (no second norm; see the module docstring)."""
    resolved = QKNormConfigResolver(config, submodules).resolve()
    if config.q_lora_rank is None and config.qk_layernorm:
        resolved["linear_q_proj"] = submodules.linear_q_proj
    return resolved


class TEMLASelfAttention(MLASelfAttention):
    """MLASelfAttention whose query projection has no fused norm when q_lora_rank is null."""

    def _resolve_qk_norm_config(self, submodules) -> dict:
        return resolve_te_mla_projections(self.config, submodules)


def te_block_spec(config, vp_stage: int | None = None, *, grouped_experts: bool = False):
    """megatron-core's TE decoder block spec with TEMLASelfAttention in every layer; with
    `grouped_experts` (actor.model.moe_grouped_gemm_impl: torch), the MoE layers' routed experts are
    rlinf's GroupedGemmExperts instead of TEGroupedMLP (rlinf.models.megatron.grouped_experts)."""
    if getattr(config, "mla_down_proj_fusion", False):
        # That spec fuses input_layernorm into the down projections, and TEMLASelfAttention assumes
        # the standalone input norm of the unfused spec.
        raise ValueError(
            "te_block_spec: mla_down_proj_fusion is not supported (the input norm must be standalone)"
        )
    block = get_gpt_decoder_block_spec(
        config, use_transformer_engine=True, normalization="RMSNorm", vp_stage=vp_stage
    )
    layer_specs = []
    for layer_spec in block.layer_specs:
        layer_spec = copy.deepcopy(layer_spec)
        attention = layer_spec.submodules.self_attention
        if attention.module is not MLASelfAttention:
            raise ValueError(f"te_block_spec builds MLA models only; the spec has {attention.module}")
        if layer_spec.submodules.input_layernorm is IdentityOp:
            raise ValueError("te_block_spec: the layer spec has no standalone input_layernorm")
        attention.module = TEMLASelfAttention
        layer_specs.append(layer_spec)
    if grouped_experts and config.num_moe_experts:
        use_grouped_experts(layer_specs, "te_block_spec")
    block.layer_specs = layer_specs
    return block
