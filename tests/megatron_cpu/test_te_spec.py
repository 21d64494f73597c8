"""The Transformer Engine spec (rlinf.models.megatron.te_spec) and the spec selection, on the CPU.

TE itself is not needed: megatron-core's TE spec provider hands out stand-in classes where TE is
missing, so the spec's structure and the MLA projection resolution can be checked here. The TE
build, load and logprobs against HF run in tests/gpu/test_megatron_actor.py.
"""

from __future__ import annotations

import functools
import importlib.util
from types import SimpleNamespace

import pytest

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import build_actor  # noqa: E402


def te_mla_submodules():
    """The MLA attention submodules of megatron-core's TE layer spec (gpt_layer_specs.py, the
    branch without mla_down_proj_fusion, qk_layernorm on as the DeepSeek bridge sets it), with the
    stand-in TE classes of a machine without TE."""
    from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.multi_latent_attention import MLASelfAttentionSubmodules

    te = TESpecProvider()
    return MLASelfAttentionSubmodules(
        linear_q_proj=te.column_parallel_linear(),
        linear_q_down_proj=te.linear(),
        linear_q_up_proj=te.column_parallel_layer_norm_linear(),
        linear_kv_down_proj=te.linear(),
        linear_kv_up_proj=te.column_parallel_layer_norm_linear(),
        core_attention=te.core_attention(),
        linear_proj=te.row_parallel_linear(),
        q_layernorm=IdentityOp,
        kv_layernorm=IdentityOp,
    )


def mla_config(q_lora_rank):
    return SimpleNamespace(
        q_lora_rank=q_lora_rank,
        qk_layernorm=True,
        qk_l2_norm=False,
        experimental_attention_variant=None,
        transformer_impl="transformer_engine",
        normalization="RMSNorm",
    )


def test_without_a_query_lora_the_query_projection_has_no_norm_of_its_own(model_parallel):
    """Moonlight (q_lora_rank null): HF normalises once (input_layernorm) before q_proj. megatron-core
    would fuse a second, trainable norm into linear_q_proj (upstream Megatron-Bridge issues 5261 /
    5294); the TE spec keeps the plain TE column-parallel linear and the standalone input norm."""
    from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.mla_qk_norm_config import QKNormConfigResolver

    from rlinf.models.megatron.te_spec import resolve_te_mla_projections

    te = TESpecProvider()
    sub = te_mla_submodules()
    upstream = QKNormConfigResolver(mla_config(None), sub).resolve()
    assert upstream["linear_q_proj"] is te.column_parallel_layer_norm_linear()  # the extra norm
    ours = resolve_te_mla_projections(mla_config(None), sub)
    assert ours["linear_q_proj"] is te.column_parallel_linear()
    assert ours["linear_q_proj"] is not te.column_parallel_layer_norm_linear()
    # the KV norm (HF kv_a_layernorm) stays fused into the KV up projection
    assert ours["linear_kv_up_proj"] is te.column_parallel_layer_norm_linear()
    assert ours["q_layernorm"] is IdentityOp and ours["kv_layernorm"] is IdentityOp


def test_with_a_query_lora_the_resolution_is_megatrons_own(model_parallel):
    from megatron.core.transformer.mla_qk_norm_config import QKNormConfigResolver

    from rlinf.models.megatron.te_spec import resolve_te_mla_projections

    sub = te_mla_submodules()
    assert (
        resolve_te_mla_projections(mla_config(64), sub) == QKNormConfigResolver(mla_config(64), sub).resolve()
    )


def test_the_layer_spec_is_the_te_spec_with_transformer_engine_and_the_te_free_one_without():
    from rlinf.config.megatron_settings import translate
    from rlinf.config.schema import ActorConfig, ModelConfig
    from rlinf.models.megatron.bridge import layer_spec, spec_name
    from rlinf.models.megatron.spec import te_free_block_spec
    from rlinf.models.megatron.te_spec import te_block_spec

    actor = ActorConfig(training_backend="megatron", model=ModelConfig(moe_grouped_gemm=True))
    te = layer_spec(translate(actor, te_available=True), te_available=True)
    assert isinstance(te, functools.partial) and te.func is te_block_spec
    assert te.keywords == {"grouped_experts": False}  # TEGroupedMLP (moe_grouped_gemm_impl: auto)
    te_free = layer_spec(translate(actor, te_available=False), te_available=False)
    assert isinstance(te_free, functools.partial) and te_free.func is te_free_block_spec
    assert te_free.keywords == {"grouped_experts": True}
    assert (spec_name(True), spec_name(False)) == ("transformer_engine", "te_free")


def test_the_te_free_actor_trains_with_megatrons_own_linears_unfused(on_cpu, tiny_megatron_checkpoint):
    """te_wgrad_fusion_without_apex leaves a build without the fusion setting untouched."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32")
    linears = [m for m in actor.model[0].modules() if isinstance(m, ColumnParallelLinear)]
    assert linears and not any(m.gradient_accumulation_fusion for m in linears)


def test_moonlights_plain_rope_reaches_megatron_as_yarn_with_factor_one(
    model_parallel, tiny_megatron_checkpoint
):
    """Why the MLA RoPE fusion (YaRN-only in megatron-core 0.19) applies to Moonlight: the bridge
    gives a checkpoint without rope scaling YaRN with scaling factor 1 and mscale 1 (the plain
    rotation), and the config accepts the fusion."""
    from rlinf.config.megatron_settings import translate
    from rlinf.config.schema import ActorConfig, ModelConfig
    from rlinf.models.megatron.bridge import provider_for

    actor = ActorConfig(
        training_backend="megatron", model=ModelConfig(model_path=str(tiny_megatron_checkpoint))
    )
    settings = translate(actor, te_available=False)
    provider = provider_for(str(tiny_megatron_checkpoint), settings, te_available=False)[1]
    assert provider.rope_type == "yarn"
    assert (provider.rotary_scaling_factor, provider.mscale, provider.mscale_all_dim) == (1.0, 1.0, 1.0)
    provider.apply_rope_fusion = True
    provider.finalize()  # megatron-core refuses the fusion for rope_type "rope" only
