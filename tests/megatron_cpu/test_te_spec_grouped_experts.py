"""`actor.model.moe_grouped_gemm_impl: torch` in the Transformer Engine spec, on the CPU: rlinf's
GroupedGemmExperts replace TEGroupedMLP in every MoE layer and nowhere else, the layer spec the bridge
picks passes the choice on, and the experts' parameters keep the names Megatron-Bridge maps to the HF
checkpoint (so load and export are those of TEGroupedMLP, whose parameters are named the same).

TE is not installed here: megatron-core's gpt_layer_specs, imported before the TE placeholder, holds
no TE spec provider, so the tests hand it megatron-core's own `TESpecProvider`, whose TE classes are
stand-ins (as in test_te_spec.py). The TE build itself runs on the GPU (tests/gpu).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

DENSE_LAYERS, LAYERS, EXPERTS = 1, 3, 4


@pytest.fixture
def te_spec_provider(model_parallel, monkeypatch):
    """megatron-core's TE spec provider with one plain class per TE module: without TE its names are
    MagicMocks (which a spec's deepcopy cannot copy) or None (then the experts would fall back to
    SequentialMLP, not the TEGroupedMLP that TE builds)."""
    from unittest.mock import MagicMock

    import megatron.core.extensions.transformer_engine_spec_provider as te_provider
    import megatron.core.models.gpt.gpt_layer_specs as gpt_layer_specs

    for name in dir(te_provider):
        if name.startswith("TE") and name != "TESpecProvider":
            value = getattr(te_provider, name)
            if value is None or isinstance(value, MagicMock):
                monkeypatch.setattr(te_provider, name, type(name, (), {}))
    monkeypatch.setattr(gpt_layer_specs, "TESpecProvider", te_provider.TESpecProvider)


def moonlight_like_config():
    """The tiny DeepSeek-V3 shape: MLA without a query LoRA, layer 0 dense, the others MoE."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    return MLATransformerConfig(
        num_layers=LAYERS,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=64,
        moe_ffn_hidden_size=16,
        num_moe_experts=EXPERTS,
        moe_layer_freq=[0] * DENSE_LAYERS + [1] * (LAYERS - DENSE_LAYERS),
        moe_shared_expert_intermediate_size=16,
        moe_router_topk=2,
        moe_grouped_gemm=True,  # what translate() gives the provider with TE
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_head_dim=8,
        qk_pos_emb_head_dim=4,
        v_head_dim=8,
        qk_layernorm=True,
        normalization="RMSNorm",
        use_cpu_initialization=True,
        params_dtype=torch.float32,
    )


def routed_experts(block) -> list:
    """Per layer: the routed experts' builder of a MoE layer, None for a dense one."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    out = []
    for layer_spec in block.layer_specs:
        mlp = layer_spec.submodules.mlp
        moe = getattr(mlp, "func", None) is MoELayer
        out.append(mlp.keywords["submodules"].experts if moe else None)
    return out


def same_builder(a, b) -> bool:
    """Two `functools.partial` builders (compared by identity) with the same function and arguments."""
    return (a.func, a.args, a.keywords) == (b.func, b.args, b.keywords)


def test_the_te_spec_gives_grouped_gemm_experts_to_every_moe_layer_and_nothing_else(te_spec_provider):
    from megatron.core.transformer.moe.experts import TEGroupedMLP
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from rlinf.models.megatron.grouped_experts import GroupedGemmExperts
    from rlinf.models.megatron.te_spec import te_block_spec

    config = moonlight_like_config()
    default, ours = te_block_spec(config), te_block_spec(config, grouped_experts=True)
    default_experts, our_experts = routed_experts(default), routed_experts(ours)
    assert default_experts[:DENSE_LAYERS] == our_experts[:DENSE_LAYERS] == [None] * DENSE_LAYERS
    assert all(e.func is TEGroupedMLP for e in default_experts[DENSE_LAYERS:])  # today's default
    assert our_experts[DENSE_LAYERS:] == [GroupedGemmExperts] * (LAYERS - DENSE_LAYERS)
    for before, after in zip(default.layer_specs, ours.layer_specs, strict=True):
        # everything but the routed experts is the TE spec's: attention, norms, router, shared experts
        b, a = before.submodules, after.submodules
        assert a.self_attention == b.self_attention and a.input_layernorm == b.input_layernorm
        assert a.pre_mlp_layernorm == b.pre_mlp_layernorm
        if getattr(b.mlp, "func", None) is MoELayer:
            b_moe, a_moe = b.mlp.keywords["submodules"], a.mlp.keywords["submodules"]
            assert a_moe.router == b_moe.router and same_builder(a_moe.shared_experts, b_moe.shared_experts)
        else:
            assert same_builder(a.mlp, b.mlp)


def test_the_bridge_builds_the_te_spec_with_the_experts_the_recipe_names(te_spec_provider):
    from rlinf.config.megatron_settings import translate
    from rlinf.config.schema import ActorConfig, ModelConfig
    from rlinf.models.megatron.bridge import layer_spec, spec_record

    for impl, expected in (
        ("auto", "TEGroupedMLP"),
        ("transformer_engine", "TEGroupedMLP"),
        ("torch", "GroupedGemmExperts"),
    ):
        actor = ActorConfig(training_backend="megatron", model=ModelConfig(moe_grouped_gemm_impl=impl))
        settings = translate(actor, te_available=True)
        block = layer_spec(settings, te_available=True)(moonlight_like_config())
        built = {getattr(e, "func", e).__name__ for e in routed_experts(block) if e is not None}
        assert built == {expected}
        record = spec_record(settings, te_available=True)
        assert record["spec"] == "transformer_engine" and record["routed_experts"] == expected
        assert record["grouped_gemm_experts"] is True


def test_grouped_gemm_experts_under_the_te_spec_keep_the_names_the_bridge_maps(te_spec_provider):
    """Every parameter of the experts the TE spec builds with the option has a Megatron-Bridge mapping
    to the HF expert tensors (DeepSeek-V3: gate_proj / up_proj / down_proj of expert e), the names
    TEGroupedMLP's GroupedLinear parameters have (`linear_fc1.weight{e}`, `linear_fc2.weight{e}`)."""
    from megatron.bridge.models.deepseek.deepseek_v3_bridge import DeepSeekV3Bridge
    from megatron.core.process_groups_config import ProcessGroupCollection

    from rlinf.models.megatron.te_spec import te_block_spec

    config = moonlight_like_config()
    experts_builder = routed_experts(te_block_spec(config, grouped_experts=True))[DENSE_LAYERS]
    experts = experts_builder(EXPERTS, config, pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    names = [name for name, _ in experts.named_parameters()]
    # registered last to first, so that DDP's reversed layout holds them in expert order (stacked_weights.py)
    assert names == [f"linear_fc{n}.weight{e}" for n in (1, 2) for e in reversed(range(EXPERTS))]
    registry = DeepSeekV3Bridge().mapping_registry()
    hf = {}
    for name in names:
        mapping = registry.megatron_to_hf_lookup(f"decoder.layers.{DENSE_LAYERS}.mlp.experts.{name}")
        assert mapping is not None, name
        hf[name] = mapping.hf_param
    assert hf["linear_fc1.weight3"] == {
        "gate": f"model.layers.{DENSE_LAYERS}.mlp.experts.3.gate_proj.weight",
        "up": f"model.layers.{DENSE_LAYERS}.mlp.experts.3.up_proj.weight",
    }
    assert hf["linear_fc2.weight3"] == f"model.layers.{DENSE_LAYERS}.mlp.experts.3.down_proj.weight"
