"""benchmarks/actor_throughput.py --megatron-variants: an entry's keys go where they act (the rows of
a forward to the actor config, actor.model keys to the recipe, the rest to the provider); an
emulated rank's prediction from a variant's rows: tests/unit/test_rank_emulation.py."""

import pytest

from benchmarks.actor_throughput import parse_variant, with_model_keys
from rlinf.config.schema import ActorConfig


def test_a_variant_sets_rows_model_keys_and_provider_settings():
    variant = parse_variant("micro_batch_size=4;moe_grouped_gemm_impl=torch;moe_permute_fusion=false")
    assert variant == {"micro_batch_size": 4, "moe_grouped_gemm_impl": "torch", "moe_permute_fusion": False}
    actor = with_model_keys(ActorConfig(micro_batch_size=1, logprob_micro_batch_size=2), variant)
    assert (actor.micro_batch_size, actor.logprob_micro_batch_size) == (4, 2)
    assert actor.model.moe_grouped_gemm_impl == "torch"
    assert not hasattr(actor.model, "moe_permute_fusion")  # a provider setting, not the recipe's


@pytest.mark.parametrize("text", ["micro_batch_size=0", "logprob_micro_batch_size=four"])
def test_rows_must_be_a_positive_count(text):
    with pytest.raises(SystemExit, match="takes a number of rows"):
        parse_variant(text)
