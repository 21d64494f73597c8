"""SGLangRollout starts its engine with SGLANG_MOE_CONFIG_DIR at our tuned tables exactly when we
ship one for that engine's expert shape (the engine's processes inherit the variable)."""

import os
from pathlib import Path

import pytest

import rlinf.models.hf_checkpoint as hf_checkpoint
import rlinf.workers.rollout.sglang_rollout as sglang_rollout
from rlinf.config import load_config
from rlinf.workers.rollout import moe_configs

MOONLIGHT_RECIPE = "examples/reasoning/config/math/moonlight-16b-grpo-megatron.yaml"
MOONLIGHT_CONFIG = Path(__file__).parents[1] / "fixtures" / "moonlight-16b-a3b-config.json"


@pytest.mark.parametrize(("ep_moe", "expected"), [(True, str(moe_configs.HERE)), (False, None)])
def test_engine_starts_with_our_tables_only_for_a_shape_we_ship(tmp_path, monkeypatch, ep_moe, expected):
    (tmp_path / "config.json").write_text(MOONLIGHT_CONFIG.read_text())
    started = {}

    class RecordingEngine:
        def __init__(self, kwargs, *, where):
            started.update(env=os.environ.get(moe_configs.ENV_VAR), ep_size=kwargs["ep_size"])

    monkeypatch.delenv(moe_configs.ENV_VAR, raising=False)  # restored (absent) after the test
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the 8-GPU span rewrites it
    monkeypatch.setattr(sglang_rollout, "import_sglang", lambda: None)
    monkeypatch.setattr(sglang_rollout, "SGLangEngine", RecordingEngine)
    monkeypatch.setattr(hf_checkpoint, "load_tokenizer", lambda path, **kw: object())
    monkeypatch.setattr(sglang_rollout, "_generation_config", lambda path: None)
    monkeypatch.setattr(sglang_rollout, "eos_token_ids", lambda generation_config, tokenizer: [2])
    monkeypatch.setattr(sglang_rollout, "pad_token_id", lambda tokenizer, eos: 0)
    cfg = load_config(
        MOONLIGHT_RECIPE,
        [
            "data.train_data_paths=[x.jsonl]",
            "data.val_data_paths=[y.jsonl]",
            "actor.optim.main_params_dtype=fp32",
            f"actor.model.model_path={tmp_path}",
            f"rollout.sglang.enable_ep_moe={str(ep_moe).lower()}",
        ],
    )
    sglang_rollout.SGLangRollout(cfg)
    # EP=8 over TP=8: 8 experts of width 1408 a GPU, a table we ship. Without EP every GPU holds a
    # 176-wide slice of all 64 experts: no table, so SGLang must keep its own folder.
    assert started == {"env": expected, "ep_size": 8 if ep_moe else 1}
