"""What an rlinf SGLang engine starts with (rlinf/workers/rollout/sglang_settings.py), no sglang needed."""

import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rlinf.config.run_record import announce
from rlinf.config.schema import Config
from rlinf.workers.rollout import moe_configs, sglang_settings
from rlinf.workers.rollout.sglang_args import engine_kwargs
from rlinf.workers.rollout.sglang_settings import (
    ENGINE_RECORD_FILE,
    check_flashmla,
    engine_record,
    engine_settings,
    flashmla_kernel,
    kernel_unusable,
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


@pytest.fixture
def flashinfer_machine(tmp_path, monkeypatch):
    """A stand-in flashinfer package on the path and a CUDA_HOME without nvcc (PATH holds none);
    the test adds nvcc or the prebuilt-kernel package. Returns (CUDA_HOME, package folder)."""
    packages = tmp_path / "site"
    (packages / "flashinfer").mkdir(parents=True)
    (packages / "flashinfer" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(packages))
    for name in ("flashinfer", "flashinfer_jit_cache"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()
    cuda_home = tmp_path / "cuda"
    (cuda_home / "bin").mkdir(parents=True)
    monkeypatch.setenv("CUDA_HOME", str(cuda_home))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv("FLASHINFER_NVCC", raising=False)
    return cuda_home, packages


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
        "decode_attention_backend": "flashinfer",
    }
    out = measured_args(recipe, measured, decode_unusable=None)
    assert out["cuda_graph_max_bs"] == 256  # the recipe's value wins
    assert out["chunked_prefill_size"] == 16384
    assert out["decode_attention_backend"] == "flashinfer" and out["prefill_attention_backend"] == "triton"
    mine = measured_args(recipe | {"decode_attention_backend": "flashmla"}, measured, decode_unusable=None)
    assert mine["decode_attention_backend"] == "flashmla" and "prefill_attention_backend" not in mine


def test_a_measured_decode_choice_is_dropped_where_it_cannot_run():
    measured = {"decode_attention_backend": "flashinfer", "chunked_prefill_size": 16384}
    out = measured_args({"attention_backend": "triton"}, measured, decode_unusable="no nvcc")
    assert out == {"attention_backend": "triton", "chunked_prefill_size": 16384}


def test_engine_settings_apply_measured_flashinfer_decode_only_where_it_runs(flashinfer_machine, monkeypatch):
    cuda_home, packages = flashinfer_machine
    cfg = Config()
    cfg = replace(
        cfg, rollout=replace(cfg.rollout, sglang=replace(cfg.rollout.sglang, attention_backend="triton"))
    )
    monkeypatch.setattr(sglang_settings, "gpu_capability", lambda: (9, 0))

    def kwargs(hf_config=MOONLIGHT, measured=None):
        return engine_settings(
            cfg, model_path="/m", hf_config=hf_config, colocated=False, measured=measured
        ).kwargs

    assert sglang_settings.MEASURED_ENGINE_ARGS == {"decode_attention_backend": "flashinfer"}
    assert "decode_attention_backend" not in kwargs()  # no way to build the kernel: the engine still starts
    (cuda_home / "bin" / "nvcc").write_text("")
    chosen = kwargs()  # the defaults on Hopper, flashinfer able to build its kernel
    assert (
        chosen["decode_attention_backend"] == "flashinfer" and chosen["prefill_attention_backend"] == "triton"
    )
    (cuda_home / "bin" / "nvcc").unlink()
    (packages / "flashinfer_jit_cache").mkdir()  # prebuilt kernels instead of nvcc
    (packages / "flashinfer_jit_cache" / "__init__.py").write_text("")
    importlib.invalidate_caches()
    assert kwargs()["decode_attention_backend"] == "flashinfer"
    # a head the choice was not measured on
    gpu_tiny = MOONLIGHT | {"kv_lora_rank": 256, "qk_rope_head_dim": 32}
    assert "decode_attention_backend" not in kwargs(gpu_tiny)
    assert "decode_attention_backend" not in kwargs(measured={})  # the benchmarks' reference engine
    monkeypatch.setattr(sglang_settings, "gpu_capability", lambda: (8, 0))  # not measured off Hopper
    assert "decode_attention_backend" not in kwargs()
    monkeypatch.setattr(sglang_settings, "gpu_capability", lambda: None)
    assert "decode_attention_backend" not in kwargs()


def test_flashinfer_needs_the_package(flashinfer_machine, monkeypatch):
    cuda_home, _ = flashinfer_machine
    (cuda_home / "bin" / "nvcc").write_text("")
    assert kernel_unusable("flashinfer") is None
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flashinfer" else real(name, *a)
    )
    assert kernel_unusable("flashinfer") == "flashinfer is not installed"


def test_flashmla_is_usable_only_with_its_kernel(sgl_kernel):
    assert "has no sgl_kernel/flashmla_ops" in kernel_unusable("flashmla")
    (sgl_kernel / "flashmla_ops.abi3.so").write_bytes(b"")
    assert kernel_unusable("flashmla") is None
    assert kernel_unusable("triton") is None  # built into SGLang


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


def test_the_engine_it_starts_is_printed_once_and_written_with_the_reason_a_default_is_off(
    flashinfer_machine, monkeypatch, tmp_path, capsys
):
    cuda_home, _ = flashinfer_machine
    monkeypatch.setattr(sglang_settings, "gpu_capability", lambda: (9, 0))
    triton = replace(Config().rollout.sglang, attention_backend="triton")
    cfg = replace(Config(), rollout=replace(Config().rollout, sglang=triton))

    def announced(cfg=cfg):
        settings = engine_settings(cfg, model_path="/m", hf_config=MOONLIGHT, colocated=False)
        logs = tmp_path / "logs"
        record = announce("sglang rollout: engine", engine_record(settings), str(logs), ENGINE_RECORD_FILE)
        printed = capsys.readouterr().out.splitlines()
        assert len(printed) == 1 and printed[0].startswith("sglang rollout: engine ")
        assert json.loads((logs / ENGINE_RECORD_FILE).read_text()) == record
        return record

    off = announced()  # flashinfer cannot build its kernel here: the recipe's triton decodes, and why
    assert off["decode_attention_backend"] is None and off["attention_backend"] == "triton"
    assert "neither nvcc nor flashinfer-jit-cache" in off["measured_decode_not_applied"]
    (cuda_home / "bin" / "nvcc").write_text("")
    on = announced()
    assert on["decode_attention_backend"] == "flashinfer" and on["prefill_attention_backend"] == "triton"
    assert on["measured_decode_not_applied"] is None
    mine = replace(triton, decode_attention_backend="triton")  # the recipe's own choice: no reason to give
    (cuda_home / "bin" / "nvcc").unlink()
    recipe = announced(replace(cfg, rollout=replace(cfg.rollout, sglang=mine)))
    assert recipe["decode_attention_backend"] == "triton" and recipe["measured_decode_not_applied"] is None
