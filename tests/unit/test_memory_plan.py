"""rlinf.models.memory_plan: parameter counts per rank against a real HF model and the Moonlight
config, and the phase table from the recipe's dtypes, SGLang share and weight-sync bucket size."""

import json
from pathlib import Path

import pytest

from rlinf.config import load_config
from rlinf.models.memory_plan import (
    GPU_BYTES,
    MIB,
    activation_bytes,
    largest_tensor_numel,
    main,
    memory_plan,
    rank_params,
)

MOONLIGHT = Path(__file__).parents[1] / "fixtures" / "moonlight-16b-a3b-config.json"
RECIPE = "moonlight-16b-grpo-megatron"


@pytest.fixture(scope="module")
def moonlight() -> dict:
    return json.loads(MOONLIGHT.read_text())


@pytest.mark.parametrize("q_lora_rank", [None, 24])  # Moonlight has none; DeepSeek-V3 has one
def test_one_rank_holds_what_the_hf_model_builds(q_lora_rank):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from rlinf.models.tiny import TinyModelSettings, random_deepseek_v3

    tiny = random_deepseek_v3(TinyModelSettings(), vocab_size=40).config.to_dict()
    model = DeepseekV3ForCausalLM(DeepseekV3Config.from_dict({**tiny, "q_lora_rank": q_lora_rank}))
    assert rank_params(model.config.to_dict()).total == sum(p.numel() for p in model.parameters())


def test_ranks_together_hold_the_model_once_apart_from_replicas(moonlight):
    whole = rank_params(moonlight)
    one = rank_params(moonlight, tp=8, ep=8)
    assert one.replicated == whole.replicated
    assert one.tensor_parallel * 8 == whole.tensor_parallel and one.experts * 8 == whole.experts
    assert rank_params(moonlight, tp=8, ep=4, etp=2).experts == one.experts  # 16 experts, halves
    assert round(whole.total / 1e9, 2) == 15.96  # Moonlight-16B-A3B
    assert round(one.total / 1e9, 2) == 2.03
    with pytest.raises(ValueError, match="TP=3 must divide the 16 heads"):
        rank_params(moonlight, tp=3)


def test_phases_follow_the_recipe(moonlight):
    cfg = load_config(RECIPE)
    gpu = GPU_BYTES["H200"]
    plan = memory_plan(cfg, moonlight, gpu)
    params = rank_params(moonlight, tp=8, ep=8).total
    # bf16 weights, fp32 gradients, masters and moments; DP = 1 shards nothing
    assert plan.static_actor == pytest.approx(18 * params)
    lm_head = 2 * largest_tensor_numel(moonlight)
    assert lm_head == 2 * 163840 * 2048 and lm_head > 512 * MIB  # travels alone, in its own buffer
    assert plan.export_peak == 2 * lm_head + 2 * lm_head
    phases = {p.name: p for p in plan.phases}
    assert phases["rollout, actor offloaded"].total == pytest.approx(0.5 * gpu)  # mem_fraction_static
    sync = phases["weight sync peak (engine weights resumed)"]
    assert sync.total == pytest.approx(plan.static_actor + 2 * params + plan.export_peak)
    bigger = memory_plan(load_config(RECIPE, ["rollout.weight_sync_bucket_mb=2048"]), moonlight, gpu)
    assert bigger.export_peak == 2 * 2048 * MIB + 2 * lm_head
    logprobs, train = "logprob recompute (engine released)", "train, one micro-batch (engine released)"
    seq = cfg.actor.seq_length
    assert cfg.actor.logprob_micro_batch_size == 4  # the recipe's: four sequences a logprob forward
    assert phases[logprobs].actor == pytest.approx(
        plan.static_actor + activation_bytes(moonlight, 4 * seq, 8)
    )
    unset = {
        p.name: p
        for p in memory_plan(
            load_config(RECIPE, ["actor.logprob_micro_batch_size=null"]), moonlight, gpu
        ).phases
    }
    assert unset[train].total == phases[train].total
    assert unset[logprobs].total == unset[train].total  # unset, the logprob pass runs training's size


def test_the_command_prints_a_table_and_refuses_a_missing_config(moonlight, capsys, tmp_path):
    assert main([RECIPE, "--hf-config", str(MOONLIGHT), "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    assert "| weight sync peak (engine weights resumed) | 34.0 | 3.8 | 2.50 | 40.2 | 51% |" in out
    # overrides after the options, as the usage line shows them
    assert (
        main([RECIPE, "--hf-config", str(MOONLIGHT), "--gpu", "H100", "rollout.weight_sync_bucket_mb=2048"])
        == 0
    )
    assert "| weight sync peak (engine weights resumed) | 34.0 | 3.8 | 5.25 |" in capsys.readouterr().out
    missing = tmp_path / "config.json"
    assert main([RECIPE, "--hf-config", str(missing)]) == 2
    assert capsys.readouterr().err.startswith(f"memory_plan: {missing}: unreadable HF config")
