import json
from pathlib import Path

import pytest

from rlinf.models.hf_checkpoint import load_causal_lm
from rlinf.models.slice import (
    MOONLIGHT_CONFIG,
    SGLANG_CONFIG_FIELDS,
    add_sglang_config_fields,
    build_random_checkpoint,
    moonlight_slice_config,
)

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    vocab_size=512,
    num_attention_heads=2,
    num_key_value_heads=2,
    n_routed_experts=4,
    num_experts_per_tok=2,
    bos_token_id=1,
    eos_token_id=2,
)


def test_moonlight_constants_match_the_published_config():
    published = json.loads(
        (Path(__file__).parents[2] / "tests/fixtures/moonlight-16b-a3b-config.json").read_text()
    )
    for key, value in MOONLIGHT_CONFIG.items():
        assert published[key] == value, key


def test_slice_checkpoint_loads_and_carries_sglang_fields(tmp_path):
    out = build_random_checkpoint(tmp_path / "s", moonlight_slice_config(3, **SMALL), dtype="bf16")
    config = json.loads((out / "config.json").read_text())
    for key, value in SGLANG_CONFIG_FIELDS.items():
        assert config[key] == value, key
    assert config["torch_dtype"] == "bfloat16"
    model = load_causal_lm(str(out), precision="fp32")
    assert len(model.model.layers) == 3
    assert model.config.kv_lora_rank == 512 and model.config.qk_rope_head_dim == 64
    # layer 0 dense, the rest MoE with the published expert count
    assert not hasattr(model.model.layers[0].mlp, "experts")
    assert model.model.layers[1].mlp.config.n_routed_experts == 4


def test_existing_config_fields_win(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"ep_size": 8, "model_type": "deepseek_v3"}))
    add_sglang_config_fields(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["ep_size"] == 8 and config["moe_layer_freq"] == 1


def test_a_slice_needs_a_moe_layer():
    with pytest.raises(ValueError, match=">= 2 layers"):
        moonlight_slice_config(1)
