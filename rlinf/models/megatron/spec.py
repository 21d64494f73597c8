"""Transformer Engine-free layer spec for DeepSeek-V3 / Moonlight (MLA + MoE) in megatron-core.

megatron-core's local (TE-free) GPT spec cannot build MLA as the HF model computes it, so this
module swaps in:
- `SDPACoreAttention`: causal attention on torch SDPA that accepts qk head dim != v head dim
  (megatron's `DotProductAttention` takes no `k_channels` / `v_channels`); padded or packed THD
  sequences; no context parallelism;
- `LocalMLASelfAttention`: plain column-parallel projections and explicit norms (no fused query
  norm when `q_lora_rank` is null: HF normalises once, in `input_layernorm`), and a full gradient
  for the RoPE key at TP > 1 (`_qkv_down_projection`);
- `RMSNorm`: HF's DeepseekV3RMSNorm arithmetic, usable under sequence parallelism.

`te_free_block_spec(config)` is megatron-core's decoder block spec with those pieces;
`grouped_experts=True` also gives the MoE layers rlinf's grouped-GEMM experts.
"""

from __future__ import annotations

import copy

import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.tensor_parallel.layers import ColumnParallelLinear
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_tensor_model_parallel_region,
    scatter_to_sequence_parallel_region,
)
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.multi_latent_attention import MLASelfAttention
from megatron.core.transformer.spec_utils import ModuleSpec

from rlinf.models.megatron.grouped_experts import use_grouped_experts


class RMSNorm(torch.nn.Module):
    """RMSNorm as transformers' DeepseekV3RMSNorm computes it, usable under sequence parallelism."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_unused) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(
            torch.ones(hidden_size, dtype=config.params_dtype, device=_init_device(config))
        )
        # Under sequence parallelism each TP rank sees a slice of the tokens, so the weight's grad
        # is partial; megatron all-reduces over TP the grads of parameters with this flag.
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _init_device(config) -> torch.device:
    if config.use_cpu_initialization or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


class SDPACoreAttention(MegatronModule):
    """Causal self-attention on torch SDPA for MLA: q/k head dim != v head dim is allowed.

    Inputs [s, b, heads, dim] (this TP rank's heads); output [s, b, heads * v_dim].
    `attention_mask` None means causal only (what the actor feeds); a megatron-style boolean mask
    [b, 1, s, s] (True = masked out) is honoured too, combined with causality.
    """

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        k_channels: int | None = None,
        v_channels: int | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
        **_unused,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size > 1:
            raise ValueError(
                "SDPACoreAttention (the TE-free MLA attention) has no context parallelism; "
                "set actor.model.context_parallel_size: 1 or install Transformer Engine"
            )
        self.softmax_scale = softmax_scale
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.layer_number = layer_number

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
        **_unused,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise ValueError("SDPACoreAttention does not take an attention bias")
        dropout = self.dropout if self.training else 0.0
        if packed_seq_params is not None:
            return self._packed(query, key, value, packed_seq_params, dropout)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        if attention_mask is None:
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=dropout, scale=self.softmax_scale
            )
        else:
            s = q.shape[2]
            causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
            allowed = causal & ~attention_mask.bool()
            # A row with nothing visible (padding) attends to itself, so no NaN reaches backward.
            allowed = allowed | torch.eye(s, dtype=torch.bool, device=q.device)
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, dropout_p=dropout, scale=self.softmax_scale
            )
        b, h, s, d = out.shape
        return out.permute(2, 0, 1, 3).reshape(s, b, h * d)

    def _packed(self, query, key, value, packed_seq_params, dropout: float) -> torch.Tensor:
        """THD: [t, heads, dim] tensors holding sequences back to back (cu_seqlens bounds); each
        sequence attends causally to itself only, one SDPA call per sequence (no cross-sequence
        block is computed). Returns [t, heads, v_dim]."""
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"SDPACoreAttention: packed format {packed_seq_params.qkv_format!r}, only 'thd'")
        bounds = packed_seq_params.cu_seqlens_q.tolist()  # one host sync per layer
        kv = packed_seq_params.cu_seqlens_kv  # the actor passes the q tensor itself: no second sync
        if kv is not None and kv is not packed_seq_params.cu_seqlens_q and kv.tolist() != bounds:
            raise ValueError("SDPACoreAttention: packed queries and keys must share their sequence bounds")
        if bounds[0] != 0 or bounds[-1] != query.shape[0]:
            raise ValueError(
                f"SDPACoreAttention: cu_seqlens {bounds[0]}..{bounds[-1]} must cover all {query.shape[0]} tokens"
            )
        parts = []
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            if end > start:
                q, k, v = (t[start:end].transpose(0, 1)[None] for t in (query, key, value))  # [1, h, s, d]
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=True, dropout_p=dropout, scale=self.softmax_scale
                )
                parts.append(out[0].transpose(0, 1))
        return torch.cat(parts)


class LocalMLASelfAttention(MLASelfAttention):
    """MLASelfAttention with explicit (non-fused) projections and norms; see the module docstring."""

    def _resolve_qk_norm_config(self, submodules) -> dict:
        has_q_lora = self.config.q_lora_rank is not None
        norm = RMSNorm if self.config.qk_layernorm else IdentityOp
        return {
            "linear_q_proj": submodules.linear_q_proj or ColumnParallelLinear,
            "linear_q_up_proj": submodules.linear_q_up_proj or ColumnParallelLinear,
            "linear_kv_up_proj": submodules.linear_kv_up_proj or ColumnParallelLinear,
            "q_layernorm": norm if has_q_lora else IdentityOp,
            "kv_layernorm": norm,
        }

    def _qkv_down_projection(self, hidden_states):
        """The down projections, with the compressed KV and RoPE key returned whole (last dim
        kv_lora_rank + rope dim), so megatron-core takes its path for an unsharded KV down projection.

        The column-parallel `linear_kv_down_proj` gives each TP rank a slice of that dim. megatron-core
        then all-gathers it, and each rank uses the RoPE key for its own heads only; the gather's
        backward only splits, so the RoPE rows of the KV down projection would get the gradient of
        1/TP of the heads (upstream Megatron-LM issue 1699). Here the backward sums over TP ranks:
        - with sequence parallelism, the gathered tensor is scattered back over the sequence and
          megatron-core gathers the RoPE key over the sequence, whose backward reduce-scatters (sums);
        - without it, the RoPE key passes an identity whose backward all-reduces. The compressed KV
          needs no such sum: the column-parallel up projection already all-reduces its input grad.
        """
        q_compressed, kv_combined = super()._qkv_down_projection(hidden_states)
        rope_dim = self.config.qk_pos_emb_head_dim
        if kv_combined.size(-1) == self.config.kv_lora_rank + rope_dim:
            return q_compressed, kv_combined
        kv_combined = gather_from_tensor_model_parallel_region(kv_combined, group=self.tp_group)
        if self.config.sequence_parallel:
            return q_compressed, scatter_to_sequence_parallel_region(kv_combined, group=self.tp_group)
        kv_compressed, k_pos_emb = torch.split(kv_combined, [self.config.kv_lora_rank, rope_dim], dim=-1)
        k_pos_emb = copy_to_tensor_model_parallel_region(k_pos_emb, group=self.tp_group)
        return q_compressed, torch.cat([kv_compressed, k_pos_emb], dim=-1)


def te_free_block_spec(config, vp_stage: int | None = None, *, grouped_experts: bool = False):
    """megatron-core's local decoder block spec with the TE-free MLA pieces above; with
    `grouped_experts`, the MoE layers' routed experts are GroupedGemmExperts."""
    block = get_gpt_decoder_block_spec(
        config, use_transformer_engine=False, normalization="RMSNorm", vp_stage=vp_stage
    )
    layer_specs = []
    for layer_spec in block.layer_specs:
        layer_spec = copy.deepcopy(layer_spec)
        sub = layer_spec.submodules
        sub.input_layernorm = RMSNorm
        sub.pre_mlp_layernorm = RMSNorm
        attention: ModuleSpec = sub.self_attention
        if attention.module is not MLASelfAttention:
            raise ValueError(f"te_free_block_spec builds MLA models only; the spec has {attention.module}")
        attention.module = LocalMLASelfAttention
        attention.submodules.core_attention = SDPACoreAttention
        attention.submodules.q_layernorm = IdentityOp
        attention.submodules.kv_layernorm = IdentityOp  # resolved by LocalMLASelfAttention
        layer_specs.append(layer_spec)
    if grouped_experts and config.num_moe_experts:
        use_grouped_experts(layer_specs, "te_free_block_spec")
    block.layer_specs = layer_specs
    block.layer_norm = RMSNorm
    return block
