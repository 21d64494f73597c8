"""benchmarks/actor_throughput.py --megatron-setting / --megatron-variants: each entry becomes the
provider setting megatron-core reads (its AttnBackend enum for attention_backend, booleans for
switches), the recipe key it names, or the rows of a forward; an emulated rank's prediction from a
variant's rows: tests/unit/test_rank_emulation.py."""

import pytest

pytest.importorskip(
    "megatron.core", reason="needs megatron-core 0.19 (bash requirements/install.sh agentic ...)"
)

from megatron.core.transformer.enums import AttnBackend  # noqa: E402

from benchmarks.megatron_variants import parse_setting, parse_variant  # noqa: E402


def test_switches_become_booleans_and_attention_backend_its_enum():
    assert parse_variant("gradient_accumulation_fusion=false") == {"gradient_accumulation_fusion": False}
    assert parse_variant(" moe_permute_fusion = True ") == {"moe_permute_fusion": True}
    assert parse_setting("attention_backend=unfused") == {"attention_backend": AttnBackend.unfused}
    assert parse_setting("attention_backend=fused") == {"attention_backend": AttnBackend.fused}


def test_the_attention_backend_is_a_setting_of_the_run_not_a_variant():
    # megatron-core fixes the process's NVTE_*_ATTN variables at the first actor's build and asserts
    # on a different backend later, so a second actor cannot change it
    with pytest.raises(SystemExit, match="one attention backend per process; use --megatron-setting"):
        parse_variant("attention_backend=unfused")


def test_an_unknown_attention_backend_is_named():
    with pytest.raises(SystemExit, match="attention_backend is one of .*'unfused'"):
        parse_setting("attention_backend=sdpa")


def test_speedups_are_taken_over_the_measured_actors_only():
    from benchmarks.actor_throughput import with_speedups

    result = {
        "megatron_settings": {"attention_backend": "unfused"},
        "torch": {"tokens_per_s": 50.0},
        "megatron": {"tokens_per_s": 40.0},
        "megatron[moe_permute_fusion=False]": {"tokens_per_s": 45.0},
    }
    out = with_speedups(result)
    assert (
        out["megatron_speedup_vs_hf"] == 0.8
        and out["megatron[moe_permute_fusion=False]_speedup_vs_hf"] == 0.9
    )
    assert "megatron_settings_speedup_vs_hf" not in out
    assert with_speedups({"megatron": {"tokens_per_s": 40.0}}) == {"megatron": {"tokens_per_s": 40.0}}


def test_the_logprob_pass_is_compared_by_its_time():
    from benchmarks.actor_throughput import with_speedups

    result = {
        "torch": {"tokens_per_s": 50.0, "seconds_per_logprob_call": 0.3},
        "megatron": {"tokens_per_s": 40.0, "seconds_per_logprob_call": 0.2},
    }
    assert with_speedups(result)["megatron_logprob_speedup_vs_hf"] == pytest.approx(1.5)  # faster than HF


def test_a_model_key_variant_changes_the_recipe_and_a_provider_key_the_provider():
    """`--megatron-variants moe_grouped_gemm_impl=torch`: the variant actor's recipe asks for rlinf's
    grouped_mm experts (translate() then picks them for the TE spec); provider keys stay provider keys."""
    import rlinf.config.megatron_settings as settings
    from benchmarks.megatron_variants import provider_overrides
    from rlinf.config.schema import ActorConfig, ModelConfig

    actor = ActorConfig(training_backend="megatron", model=ModelConfig())
    variant = {**parse_variant("moe_grouped_gemm_impl=torch"), **parse_variant("moe_permute_fusion=false")}
    with provider_overrides(variant):
        changed = settings.translate(actor, te_available=True)
    assert changed.grouped_experts and changed.provider["moe_permute_fusion"] is False
    assert "moe_grouped_gemm_impl" not in changed.provider
    unchanged = settings.translate(actor, te_available=True)  # the default actor of the same run
    assert not unchanged.grouped_experts and unchanged.provider["moe_permute_fusion"] is True


def test_a_cuda_graph_variant_reaches_the_actors_own_config():
    """`--megatron-variants "cuda_graph_impl=transformer_engine;cuda_graph_modules=moe_router+moe_preprocess"`:
    one variant of two settings, the list's items joined by "+"; the Megatron actor reads these keys
    from its config (its graphs, its fixed micro-batch shape), so the variant's config carries them."""
    from benchmarks.megatron_variants import with_model_keys
    from rlinf.config.megatron_graphs import fixed_train_shape
    from rlinf.config.schema import ActorConfig, Config

    variant = parse_variant("cuda_graph_impl=transformer_engine;cuda_graph_modules=moe_router+moe_preprocess")
    assert variant == {
        "cuda_graph_impl": "transformer_engine",
        "cuda_graph_modules": ("moe_router", "moe_preprocess"),
    }
    cfg = Config(actor=ActorConfig(training_backend="megatron", micro_batch_size=8, seq_length=1024))
    graphed = with_model_keys(cfg.actor, {**variant, "moe_permute_fusion": False})
    assert graphed.model.cuda_graph_impl == "transformer_engine"
    assert graphed.model.cuda_graph_modules == ("moe_router", "moe_preprocess")
    assert fixed_train_shape(graphed) is not None and fixed_train_shape(cfg.actor) is None


def test_a_variant_may_set_the_rows_of_a_forward():
    """`--megatron-variants "micro_batch_size=4;moe_grouped_gemm_impl=torch"`: the rows go to the
    variant's actor config, never to the provider."""
    import rlinf.config.megatron_settings as settings
    from benchmarks.megatron_variants import provider_overrides, with_model_keys
    from rlinf.config.schema import ActorConfig

    variant = parse_variant("micro_batch_size=4;moe_grouped_gemm_impl=torch;moe_permute_fusion=false")
    assert variant == {"micro_batch_size": 4, "moe_grouped_gemm_impl": "torch", "moe_permute_fusion": False}
    actor = ActorConfig(training_backend="megatron", micro_batch_size=1, logprob_micro_batch_size=2)
    changed = with_model_keys(actor, variant)
    assert (changed.micro_batch_size, changed.logprob_micro_batch_size) == (4, 2)
    assert changed.model.moe_grouped_gemm_impl == "torch"
    with provider_overrides(variant):
        provider = settings.translate(actor, te_available=True).provider
    assert "micro_batch_size" not in provider and provider["moe_permute_fusion"] is False


@pytest.mark.parametrize("text", ["micro_batch_size=0", "logprob_micro_batch_size=four"])
def test_rows_must_be_a_positive_count(text):
    with pytest.raises(SystemExit, match="takes a number of rows"):
        parse_variant(text)
