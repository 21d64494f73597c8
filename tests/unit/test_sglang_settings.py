"""What an rlinf SGLang engine starts with (rlinf/workers/rollout/sglang_settings.py), no sglang needed."""

import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rlinf.config.schema import Config
from rlinf.workers.rollout import moe_configs, sglang_settings
from rlinf.workers.rollout.sglang_args import engine_kwargs
from rlinf.workers.rollout.sglang_settings import (
    check_flashmla,
    engine_settings,
    flashmla_kernel,
    measured_args,
)

MOONLIGHT = json.loads(Path("tests/fixtures/moonlight-16b-a3b-config.json").read_text())


@pytest.fixture
def sgl_kernel(tmp_path, monkeypatch):
    """A stand-in sglang-kernel package on the path; the test decides whether it has FlashMLA."""
    package = tmp_path / "sgl_kernel"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sgl_kernel", raising=False)
    importlib.invalidate_caches()
    return package


def test_one_gpu_engine_gets_the_tuned_moe_tables_and_the_sampler_plugin():
    # The benchmark's engine (TP 1: all 64 experts on the GPU) and the rollout's take this path.
    cfg = Config()
    settings = engine_settings(cfg, model_path="/m27", hf_config=MOONLIGHT, colocated=False, measured={})
    assert settings.env == {"SGLANG_MOE_CONFIG_DIR": str(moe_configs.HERE), "RLINF_SGLANG_HOOKS": "1"}
    assert settings.kwargs == engine_kwargs(cfg, model_path="/m27", colocated=False)


def test_a_shape_without_tables_keeps_sglangs_own_folder():
    dense = {k: v for k, v in MOONLIGHT.items() if k != "n_routed_experts"}
    settings = engine_settings(Config(), model_path="/m", hf_config=dense, colocated=False, measured={})
    assert "SGLANG_MOE_CONFIG_DIR" not in settings.env


def test_measured_choices_fill_only_what_the_recipe_leaves_unset():
    recipe = {"attention_backend": "triton", "cuda_graph_max_bs": 256}
    measured = {
        "cuda_graph_max_bs": 512,
        "chunked_prefill_size": 16384,
        "decode_attention_backend": "flashmla",
    }
    out = measured_args(recipe, measured, flashmla_unusable=None)
    assert out["cuda_graph_max_bs"] == 256  # the recipe's value wins
    assert out["chunked_prefill_size"] == 16384
    assert out["decode_attention_backend"] == "flashmla" and out["prefill_attention_backend"] == "triton"


def test_a_measured_flashmla_choice_is_dropped_where_the_kernel_is_missing():
    measured = {"decode_attention_backend": "flashmla", "chunked_prefill_size": 16384}
    out = measured_args({"attention_backend": "triton"}, measured, flashmla_unusable="no kernel")
    assert out == {"attention_backend": "triton", "chunked_prefill_size": 16384}


def test_engine_settings_apply_measured_flashmla_only_where_it_runs(sgl_kernel, monkeypatch):
    cfg = Config()
    cfg = replace(
        cfg, rollout=replace(cfg.rollout, sglang=replace(cfg.rollout.sglang, attention_backend="triton"))
    )
    monkeypatch.setattr(sglang_settings, "gpu_capability", lambda: (9, 0))

    def kwargs(hf_config=MOONLIGHT, measured=None):
        return engine_settings(
            cfg, model_path="/m", hf_config=hf_config, colocated=False, measured=measured
        ).kwargs

    assert "decode_attention_backend" not in kwargs()  # the defaults, no kernel: the engine still starts
    (sgl_kernel / "flashmla_ops.abi3.so").write_bytes(b"")
    chosen = kwargs()  # the defaults (MEASURED_ENGINE_ARGS) on Hopper with the kernel
    assert (
        chosen["decode_attention_backend"] == "flashmla" and chosen["prefill_attention_backend"] == "triton"
    )
    gpu_tiny = MOONLIGHT | {"kv_lora_rank": 256, "qk_rope_head_dim": 32}  # a head FlashMLA cannot decode
    assert "decode_attention_backend" not in kwargs(gpu_tiny)
    assert "decode_attention_backend" not in kwargs(measured={})  # the benchmarks' reference engine
    monkeypatch.setattr(sglang_settings, "gpu_capability", lambda: (8, 0))  # not measured off Hopper
    assert "decode_attention_backend" not in kwargs()
    monkeypatch.setattr(sglang_settings, "gpu_capability", lambda: None)
    assert "decode_attention_backend" not in kwargs()


def test_flashmla_kernel_is_found_in_the_installed_sgl_kernel(sgl_kernel):
    assert flashmla_kernel() is None
    with pytest.raises(
        ValueError, match="decode_attention_backend = flashmla needs sglang-kernel's FlashMLA"
    ):
        check_flashmla(
            {"attention_backend": "triton", "decode_attention_backend": "flashmla"}, "rollout engine 0"
        )
    check_flashmla({"attention_backend": "triton"}, "rollout engine 0")  # no FlashMLA asked: fine
    (sgl_kernel / "flashmla_ops.abi3.so").write_bytes(b"")
    assert flashmla_kernel() == sgl_kernel / "flashmla_ops.abi3.so"
    check_flashmla({"decode_attention_backend": "flashmla"}, "rollout engine 0")
