"""Recipe -> Megatron settings (rlinf.config.megatron_settings): pure translation, no megatron needed."""

import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlinf.config import ConfigError, load_config
from rlinf.config.megatron_settings import (
    MOMENT_FRACTION_BITS,
    MegatronSettingsError,
    decay_rounds_away,
    decaying_beta_bound,
    precision_problems,
    rounded_moment_problems,
    translate,
)
from rlinf.config.schema import ActorConfig, ModelConfig, OptimConfig
from rlinf.workers.actor.megatron_state import EXPERT_WEIGHT_ORDER

ROOT = Path(__file__).resolve().parents[2]
MOONLIGHT = ROOT / "examples/reasoning/config/math/moonlight-16b-grpo-megatron.yaml"


def moonlight_actor() -> ActorConfig:
    return load_config(str(MOONLIGHT)).actor


def test_moonlight_recipe_translates_to_the_parallel_and_moe_settings_it_names():
    s = translate(moonlight_actor(), te_available=True)
    p = s.provider
    assert (
        p["tensor_model_parallel_size"],
        p["expert_model_parallel_size"],
        p["expert_tensor_parallel_size"],
    ) == (8, 8, 1)
    assert (
        p["pipeline_model_parallel_size"] == 1 and p["context_parallel_size"] == 1 and p["sequence_parallel"]
    )
    assert p["seq_length"] == 9216 and p["bf16"] and p["params_dtype"] == "bfloat16"
    # RL: no aux loss, frozen routing bias, fp32 router, alltoall, no MTP
    assert p["moe_aux_loss_coeff"] == 0.0 and p["moe_router_load_balancing_type"] == "none"
    assert p["moe_router_bias_update_rate"] == 0.0 and p["moe_router_dtype"] == "fp32"
    assert p["moe_token_dispatcher_type"] == "alltoall" and p["mtp_num_layers"] is None
    # the fusions of the TE path
    assert p["gradient_accumulation_fusion"] is True and p["moe_permute_fusion"] is True
    assert p["apply_rope_fusion"] is True and "transformer_impl" not in p
    assert p["recompute_granularity"] == "selective" and p["recompute_modules"] == ["core_attn", "moe_act"]
    assert p["moe_grouped_gemm"] is True  # with Transformer Engine
    o = s.optimizer
    assert o["use_distributed_optimizer"] and o["use_precision_aware_optimizer"]
    # fp32 moments: TE's FusedAdam would round bf16 ones to nearest (rounded_moment_problems)
    assert (o["main_params_dtype"], o["exp_avg_dtype"], o["exp_avg_sq_dtype"]) == (
        "float32",
        "float32",
        "float32",
    )
    assert o["lr"] == 1e-6 and o["clip_grad"] == 1.0 and o["bf16"]
    assert s.ddp["use_distributed_optimizer"] and s.warnings == ()


def test_without_transformer_engine_fusions_are_off_and_compact_adamw_keeps_bf16_moments():
    s = translate(moonlight_actor(), te_available=False)
    p = s.provider
    assert p["transformer_impl"] == "local" and p["cross_entropy_fusion_impl"] != "te"
    assert not p["moe_grouped_gemm"] and not p["moe_permute_fusion"] and not p["persist_layer_norm"]
    assert not p["gradient_accumulation_fusion"] and not p["apply_rope_fusion"]
    o = s.optimizer
    # megatron-core's own fp32 path (its config refuses low-precision moments without TE) ...
    assert not o["use_precision_aware_optimizer"]
    assert {o[k] for k in ("main_params_dtype", "main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")} == {
        "float32"
    }
    # ... with its AdamW swapped for CompactAdamW where the moments are bf16 (the recipe's are fp32)
    assert s.compact_moments is None
    recipe = moonlight_actor()
    bf16 = replace(recipe, optim=replace(recipe.optim, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"))
    assert translate(bf16, te_available=False).compact_moments == ("bf16", "bf16")
    assert translate(bf16, te_available=False).optimizer["exp_avg_sq_dtype"] == "float32"
    # megatron-core refuses moe_act recompute without grouped GEMM (seen on the H200): dropped, said
    assert p["recompute_granularity"] == "selective" and p["recompute_modules"] == ["core_attn"]
    assert len(s.warnings) == 1 and "moe_act" in s.warnings[0]


def test_mixed_moments_without_transformer_engine_swap_in_compact_adamw():
    recipe = moonlight_actor()
    mixed = replace(recipe, optim=replace(recipe.optim, exp_avg_dtype="bf16"))
    assert translate(mixed, te_available=False).compact_moments == ("bf16", "fp32")


def _decay_survives_rounding(dtype: torch.dtype, fraction_bits: int, beta: float) -> list[bool]:
    """For every significand of one binade of `dtype`: whether beta x value, rounded to nearest in
    `dtype` by torch, differs from the value (the moment decayed)."""
    values = 1.0 + torch.arange(2**fraction_bits, dtype=torch.float64) / 2**fraction_bits
    stored = values.to(dtype)
    assert torch.equal(stored.double(), values)  # every one exact in the format
    return (torch.tensor(beta, dtype=torch.float32) * stored.float()).to(dtype).ne(stored).tolist()


FORMATS = [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp8", torch.float8_e4m3fn)]


@pytest.mark.parametrize(("name", "dtype"), FORMATS)
def test_the_decay_rule_agrees_with_torch_rounding_at_every_beta(name, dtype):
    bits = MOMENT_FRACTION_BITS[name]
    betas = [1 - d for d in torch.logspace(-0.5, -4.5, 400, dtype=torch.float64).tolist()]
    for beta in betas:
        assert decay_rounds_away(name, beta) == (not all(_decay_survives_rounding(dtype, bits, beta))), beta
    assert not decay_rounds_away(name, 0.5) and decay_rounds_away(name, 0.99999)
    # the bound the message suggests decays every value
    assert all(_decay_survives_rounding(dtype, bits, decaying_beta_bound(name)))
    assert not decay_rounds_away(name, decaying_beta_bound(name))


def test_bf16_second_moment_at_beta2_0999_never_decays_in_fused_adam_and_is_refused_with_transformer_engine():
    assert not any(_decay_survives_rounding(torch.bfloat16, 7, 0.999))  # frozen at every value
    recipe = moonlight_actor()
    frozen = replace(recipe, optim=replace(recipe.optim, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"))
    with pytest.raises(
        MegatronSettingsError, match=r"actor.optim.exp_avg_sq_dtype: bf16 with adam_beta2 0.999: .*FusedAdam"
    ) as error:
        translate(frozen, te_available=True)
    assert "use exp_avg_sq_dtype: fp32, or adam_beta2 <= 0.996094" in str(error.value)
    assert isinstance(error.value, ConfigError)  # a worker raising it exits as a config error
    # rlinf's CompactAdamW (no TE) rounds stochastically: the decay survives in expectation
    assert translate(frozen, te_available=False).compact_moments == ("bf16", "bf16")
    # DeepSeek-V3's beta2 0.95 decays 5% a step, which bf16 holds
    deepseek = replace(frozen, optim=replace(frozen.optim, adam_beta2=0.95))
    assert translate(deepseek, te_available=True).optimizer["exp_avg_sq_dtype"] == "bfloat16"
    # the first moment's 0.9 decays 10% a step: bf16 and even FP8 hold it; FP8 cannot hold 0.99
    fp8 = replace(recipe, optim=replace(recipe.optim, exp_avg_dtype="fp8"))
    translate(fp8, te_available=True)
    slow = replace(fp8, optim=replace(fp8.optim, adam_beta1=0.99))
    with pytest.raises(MegatronSettingsError, match="actor.optim.exp_avg_dtype: fp8 with adam_beta1 0.99"):
        translate(slow, te_available=True)
    # fp32 moments, or no precision-aware optimizer, round nothing
    assert rounded_moment_problems(replace(recipe.optim, exp_avg_dtype="fp32")) == []


@pytest.mark.parametrize(
    ("key", "value"), [("exp_avg_dtype", "fp8"), ("exp_avg_sq_dtype", "fp16"), ("main_params_dtype", "fp16")]
)
def test_what_only_fused_adam_offers_is_refused_without_transformer_engine(key, value):
    recipe = moonlight_actor()
    actor = replace(recipe, optim=replace(recipe.optim, **{key: value}))
    translate(actor, te_available=True)  # fine with TE
    with pytest.raises(MegatronSettingsError, match=f"actor.optim.{key}: {value} .*Transformer Engine"):
        translate(actor, te_available=False)


def test_moe_grouped_gemm_selects_rlinf_grouped_experts_only_without_transformer_engine():
    recipe = moonlight_actor()
    assert recipe.model.moe_grouped_gemm  # the recipe turns it on (verified on the H200)
    off = replace(recipe, model=replace(recipe.model, moe_grouped_gemm=False))
    assert not translate(off, te_available=False).grouped_experts  # SequentialMLP
    actor = recipe
    without_te = translate(actor, te_available=False)
    # the spec swaps the experts; megatron's own flag (TE grouped GEMM) stays off
    assert without_te.grouped_experts and not without_te.provider["moe_grouped_gemm"]
    # without TE megatron-core refuses moe_act recompute whatever the experts: dropped, with the warning
    assert without_te.provider["recompute_modules"] == ["core_attn"]
    with_te = translate(actor, te_available=True)  # TE: megatron's TEGroupedMLP, as without the key
    assert with_te.provider["moe_grouped_gemm"] and not with_te.grouped_experts
    assert translate(off, te_available=True).provider["moe_grouped_gemm"]


def test_grouped_experts_without_transformer_engine_refuse_expert_tensor_parallelism():
    actor = ActorConfig(model=ModelConfig(moe_grouped_gemm=True, expert_tensor_parallel_size=2))
    with pytest.raises(MegatronSettingsError, match="moe_grouped_gemm.*expert_tensor_parallel_size = 2"):
        translate(actor, te_available=False)
    assert translate(actor, te_available=True).provider["expert_tensor_parallel_size"] == 2


@pytest.mark.parametrize(("written", "now"), [(None, True), (False, True), (True, False)])
def test_an_actor_checkpoint_resumes_only_with_the_experts_it_was_written_with(tmp_path, written, now):
    """The distributed optimizer's flat state follows the experts' parameter order (SequentialMLP's
    and the grouped experts' differ); `written` None: a checkpoint from before the key existed."""

    from rlinf.utils.checkpoint import CheckpointError
    from rlinf.workers.actor.megatron_actor import MegatronActor

    loop = {"optimizer_steps": 3, "expert_weight_order": EXPERT_WEIGHT_ORDER}
    loop |= {} if written is None else {"grouped_experts": written}
    actor = types.SimpleNamespace(
        megatron_settings=types.SimpleNamespace(grouped_experts=now),
        _adam_moments=lambda: ["fp32", "fp32"],
        te_available=False,
    )
    with pytest.raises(CheckpointError, match="moe_grouped_gemm"):
        MegatronActor._check_same_layout(actor, tmp_path, loop)
    actor.megatron_settings.grouped_experts = bool(written)
    MegatronActor._check_same_layout(actor, tmp_path, loop)


def test_a_grouped_experts_checkpoint_of_the_earlier_weight_order_loads_its_weights_only(tmp_path):
    """Checkpoints from before `expert_weight_order` hold the grouped experts' optimizer state in the
    first-to-last order; resuming them would hand Adam states to the wrong experts."""
    from rlinf.utils.checkpoint import CheckpointError
    from rlinf.workers.actor.megatron_actor import MegatronActor

    actor = types.SimpleNamespace(
        megatron_settings=types.SimpleNamespace(grouped_experts=True),
        _adam_moments=lambda: ["fp32", "fp32"],
        te_available=False,
    )
    earlier = {"optimizer_steps": 3, "grouped_experts": True}
    with pytest.raises(CheckpointError, match=f"earlier parameter order.*rlinf.export_hf {tmp_path} OUT_DIR"):
        MegatronActor._check_same_layout(actor, tmp_path, earlier)
    MegatronActor._check_same_layout(actor, tmp_path, earlier, weights_only=True)
    MegatronActor._check_same_layout(actor, tmp_path, earlier | {"expert_weight_order": EXPERT_WEIGHT_ORDER})
    actor.megatron_settings.grouped_experts = False  # SequentialMLP's order never changed
    MegatronActor._check_same_layout(actor, tmp_path, {"optimizer_steps": 3})


@pytest.mark.parametrize(
    ("written", "te_now"), [(None, True), ("transformer_engine", False), ("te_free", True)]
)
def test_an_actor_checkpoint_resumes_only_with_the_layer_spec_it_was_written_with(tmp_path, written, te_now):
    """`written` None: a checkpoint from before the key existed (only the TE-free spec ran then)."""
    from rlinf.utils.checkpoint import CheckpointError
    from rlinf.workers.actor.megatron_actor import MegatronActor

    loop = {"optimizer_steps": 3} | ({} if written is None else {"spec": written})
    actor = types.SimpleNamespace(
        megatron_settings=types.SimpleNamespace(grouped_experts=False),
        _adam_moments=lambda: ["fp32", "fp32"],
        te_available=te_now,
    )
    with pytest.raises(CheckpointError, match=f"written with the {written or 'te_free'} layer spec"):
        MegatronActor._check_same_layout(actor, tmp_path, loop)
    actor.te_available = written == "transformer_engine"
    MegatronActor._check_same_layout(actor, tmp_path, loop)


@pytest.mark.parametrize(("written", "now"), [(None, ["bf16", "bf16"]), (["bf16", "bf16"], ["fp32", "fp32"])])
def test_an_actor_checkpoint_resumes_only_with_the_adam_moment_dtypes_it_was_written_with(
    tmp_path, written, now
):
    """`written` None: a checkpoint from before the key existed (fp32 moments)."""

    from rlinf.utils.checkpoint import CheckpointError
    from rlinf.workers.actor.megatron_actor import MegatronActor

    loop = {"optimizer_steps": 3} | ({} if written is None else {"adam_moments": written})
    actor = types.SimpleNamespace(
        megatron_settings=types.SimpleNamespace(grouped_experts=False),
        _adam_moments=lambda: now,
        te_available=False,
    )
    moments = "/".join(written or ["fp32", "fp32"])
    with pytest.raises(CheckpointError, match=f"Adam moments in {moments} .* keeps them in {'/'.join(now)}"):
        MegatronActor._check_same_layout(actor, tmp_path, loop)
    actor._adam_moments = lambda: written or ["fp32", "fp32"]
    MegatronActor._check_same_layout(actor, tmp_path, loop)


def test_the_adam_moment_dtypes_are_the_recipes_only_with_the_precision_aware_optimizer():
    from rlinf.workers.actor.megatron_actor import MegatronActor

    def moments(**optim):
        actor = types.SimpleNamespace(
            cfg=types.SimpleNamespace(actor=ActorConfig(optim=OptimConfig(**optim)))
        )
        return MegatronActor._adam_moments(actor)

    assert moments() == ["fp32", "fp32"]
    assert moments(use_precision_aware_optimizer=True, exp_avg_dtype="bf16") == ["bf16", "fp32"]


def test_recompute_full_uses_uniform_single_layer_checkpoints():
    actor = ActorConfig(model=ModelConfig(recompute_granularity="full"))
    p = translate(actor, te_available=False).provider
    assert (p["recompute_method"], p["recompute_num_layers"], p["recompute_modules"]) == ("uniform", 1, None)


def test_fp32_recipe_keeps_fp32_everywhere():
    s = translate(ActorConfig(model=ModelConfig(precision="fp32")), te_available=False)
    assert not s.provider["bf16"] and s.provider["params_dtype"] == "float32"
    assert s.ddp["grad_reduce_in_fp32"] and s.optimizer["params_dtype"] == "float32"


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_bf16_or_fp8_master_weights_are_refused(dtype):
    optim = OptimConfig(use_precision_aware_optimizer=True, main_params_dtype=dtype)
    (problem,) = precision_problems(optim)
    assert problem.startswith("actor.optim.main_params_dtype:") and "fp32 or fp16" not in problem
    assert "fp32, fp16" in problem
    with pytest.raises(MegatronSettingsError, match="main_params_dtype"):
        translate(ActorConfig(optim=optim), te_available=True)


def test_low_precision_states_need_the_precision_aware_optimizer():
    (problem,) = precision_problems(OptimConfig(exp_avg_dtype="bf16"))
    assert "use_precision_aware_optimizer" in problem and problem.startswith("actor.optim.exp_avg_dtype")
    assert precision_problems(OptimConfig(use_precision_aware_optimizer=True, exp_avg_dtype="fp8")) == []
    (problem,) = precision_problems(OptimConfig(exp_avg_sq_dtype="int4"))
    assert "exp_avg_sq_dtype" in problem


def test_unsupported_parallel_layouts_are_named():
    with pytest.raises(MegatronSettingsError, match="pipeline_model_parallel_size"):
        translate(ActorConfig(model=ModelConfig(pipeline_model_parallel_size=2)), te_available=True)
    with pytest.raises(MegatronSettingsError, match="context_parallel_size"):
        translate(ActorConfig(model=ModelConfig(context_parallel_size=2)), te_available=False)
    with pytest.raises(MegatronSettingsError, match="recompute_modules"):
        translate(
            ActorConfig(model=ModelConfig(recompute_granularity="selective", recompute_modules=("x",))),
            te_available=True,
        )


def test_the_loader_refuses_context_parallelism_with_or_without_te_before_any_worker_starts():
    with pytest.raises(MegatronSettingsError, match="context_parallel_size"):
        translate(ActorConfig(model=ModelConfig(context_parallel_size=2)), te_available=True)
    with pytest.raises(ConfigError, match="does not split sequences over CP ranks"):
        load_config(
            str(MOONLIGHT),
            overrides=["actor.model.context_parallel_size=2", "actor.model.tensor_model_parallel_size=4"],
        )


def test_the_loader_refuses_bf16_master_weights_before_any_worker_starts():
    with pytest.raises(ConfigError, match="main_params_dtype"):
        load_config(str(MOONLIGHT), overrides=["actor.optim.main_params_dtype=bf16"])


def test_the_moonlight_recipe_itself_is_valid():
    actor = moonlight_actor()
    assert actor.optim.main_params_dtype == "fp32" and replace(actor).training_backend == "megatron"


# moe_grouped_gemm_impl x Transformer Engine x moe_grouped_gemm -> rlinf's GroupedGemmExperts?
EXPERT_CHOICES = [
    ("auto", True, True, False),  # TE: TEGroupedMLP, whatever moe_grouped_gemm says (today's default)
    ("auto", True, False, False),
    ("auto", False, True, True),  # without TE: moe_grouped_gemm picks rlinf's experts ...
    ("auto", False, False, False),  # ... or SequentialMLP
    ("transformer_engine", True, True, False),
    ("torch", True, True, True),  # the option: rlinf's experts in the TE spec
    ("torch", True, False, True),
    ("torch", False, True, True),
]


@pytest.mark.parametrize(("impl", "te", "grouped_gemm", "rlinf_experts"), EXPERT_CHOICES)
def test_moe_grouped_gemm_impl_picks_the_routed_experts(impl, te, grouped_gemm, rlinf_experts):
    recipe = moonlight_actor()  # selective recompute of core_attn and moe_act
    actor = replace(
        recipe, model=replace(recipe.model, moe_grouped_gemm=grouped_gemm, moe_grouped_gemm_impl=impl)
    )
    s = translate(actor, te_available=te)
    assert s.grouped_experts is rlinf_experts
    # megatron's own flag still follows TE alone: with TE the rest of the TE spec (fused permute,
    # TE linears writing main_grad) is unchanged when rlinf's experts replace TEGroupedMLP
    assert s.provider["moe_grouped_gemm"] is te and s.provider["moe_permute_fusion"] is te
    assert s.provider["gradient_accumulation_fusion"] is te
    # with TE both TEGroupedMLP and rlinf's experts recompute moe_act; without TE megatron-core
    # refuses it (it asks for its own grouped-GEMM flag), so it is dropped, with one warning
    expected = ["core_attn", "moe_act"] if te else ["core_attn"]
    assert s.provider["recompute_modules"] == expected
    assert [w for w in s.warnings if "moe_act" in w] == ([] if te else [s.warnings[0]])


@pytest.mark.parametrize(
    ("impl", "te", "grouped_gemm", "etp", "message"),
    [
        (
            "transformer_engine",
            False,
            True,
            1,
            "moe_grouped_gemm_impl: transformer_engine needs Transformer Engine",
        ),
        ("torch", False, False, 1, "moe_grouped_gemm_impl: torch with moe_grouped_gemm: false"),
        ("torch", True, True, 2, "moe_grouped_gemm_impl: rlinf's grouped-GEMM experts have no expert tensor"),
        ("auto", False, True, 2, "moe_grouped_gemm: rlinf's grouped-GEMM experts have no expert tensor"),
    ],
)
def test_what_the_chosen_experts_cannot_run_is_one_line_naming_the_key(impl, te, grouped_gemm, etp, message):
    model = ModelConfig(
        moe_grouped_gemm=grouped_gemm, moe_grouped_gemm_impl=impl, expert_tensor_parallel_size=etp
    )
    with pytest.raises(MegatronSettingsError) as error:
        translate(ActorConfig(model=model), te_available=te)
    assert str(error.value).startswith(f"actor.model.{message}") and "\n" not in str(error.value)


def test_an_unknown_moe_grouped_gemm_impl_is_refused_by_the_loader():
    with pytest.raises(ConfigError, match="moe_grouped_gemm_impl"):
        load_config(str(MOONLIGHT), ["actor.model.moe_grouped_gemm_impl=cutlass"])
