"""benchmarks/actor_throughput.py --megatron-variants: an entry's keys go where they act (the rows of
a forward to the actor config, actor.model keys to the recipe, the rest to the provider), and an
emulated rank's prediction takes the variant's rows a forward."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.actor_throughput import parse_variant, predicted_step, with_model_keys
from rlinf.config.schema import ActorConfig

MOONLIGHT = json.loads((Path(__file__).parents[1] / "fixtures" / "moonlight-16b-a3b-config.json").read_text())


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


def test_the_prediction_takes_the_variants_rows():
    args = SimpleNamespace(
        recipe="moonlight-16b-grpo-megatron",
        rows=8,
        micro_batch=1,
        logprob_micro_batch=None,
        prompt=1024,
        response=8192,
    )
    measured = {"seconds_per_train_call": 4.0, "seconds_per_logprob_call": 1.0}
    own = predicted_step(args, MOONLIGHT, measured)
    four = predicted_step(args, MOONLIGHT, measured, {"micro_batch_size": 4})
    assert (own["micro_batches_per_step_per_rank"], four["micro_batches_per_step_per_rank"]) == (512, 128)
    assert (own["logprob_forwards_per_step_per_rank"], four["logprob_forwards_per_step_per_rank"]) == (
        512,
        128,
    )
    assert four["tokens_per_micro_batch"] == 4 * 9216
    logprob_four = predicted_step(args, MOONLIGHT, measured, {"logprob_micro_batch_size": 4})
    assert logprob_four["micro_batches_per_step_per_rank"] == 512
    assert logprob_four["logprob_forwards_per_step_per_rank"] == 128
    # the measured part is per sequence, from the same medians: only the collectives' latency moves
    assert four["actor_s_per_step"] < logprob_four["actor_s_per_step"] < own["actor_s_per_step"]
    assert own["actor_s_per_step"] - own["collective_s_per_step"] == pytest.approx(512 * 5.0 / 8)
