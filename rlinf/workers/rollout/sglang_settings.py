"""Everything an rlinf SGLang engine starts with: the recipe's engine arguments (`engine_kwargs`),
the engine settings chosen by measurement (`MEASURED_ENGINE_ARGS`), and the environment of its
processes (our tuned MoE kernel tables where they cover the engine's expert shape, rlinf's sampler
plugin). The rollout worker and `benchmarks/rollout_decode.py` both start engines from
`engine_settings`, so a benchmark's default engine is the engine users get.

Pure Python (no sglang import, no CUDA), tested on the CPU (tests/unit/test_sglang_settings.py).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlinf.config.run_record import package_version
from rlinf.config.schema import Config
from rlinf.workers.rollout import moe_configs
from rlinf.workers.rollout.sglang_args import engine_kwargs
from rlinf.workers.rollout.sglang_hooks import ENV_SWITCH as HOOKS_SWITCH

logger = logging.getLogger(__name__)

# SGLang engine arguments chosen by measurement at Moonlight's full depth (27 layers) on Hopper,
# each with its gain over the configuration without it, measured in the same run (docs/benchmarks.md,
# "SGLang decode at full depth"; `bash tests/gpu/sglang_gpu_checks.sh depth27 ...` measures them).
# The one place such choices go. Each applies only where the recipe leaves the field unset (a
# recipe key that maps to the field wins).
# - flashinfer's MLA decode (triton prefill): against FlashMLA decode, +3.7% / +3.8% decode tokens/s
#   at batch 64 and +6.7% / +3.6% at batch 256 (two runs); FlashMLA was +14% / +33% over triton
#   decode. It applies only where it can run (`measured_decode_unusable`): Moonlight's MLA head
#   (kv_lora_rank 512 + rope 64), a Hopper GPU, flashinfer able to build its kernel; elsewhere the
#   engine starts with the recipe's attention backend alone.
MEASURED_ENGINE_ARGS: dict[str, Any] = {"decode_attention_backend": "flashinfer"}

FLASHMLA = "flashmla"
FLASHMLA_KERNEL_GLOB = "flashmla_ops*.so"  # sglang-kernel's FlashMLA extension (sgl_kernel/flash_mla.py)
FLASHINFER = "flashinfer"
MEASURED_MLA_DIMS = (512, 64)  # (kv_lora_rank, qk_rope_head_dim): Moonlight's MLA head


@dataclass(frozen=True)
class EngineSettings:
    kwargs: dict[str, Any]  # sglang.Engine(**kwargs)
    env: dict[str, str]  # set in the starting process; the engine's processes inherit it
    measured_decode_not_applied: str | None = None  # why MEASURED_ENGINE_ARGS' decode backend is off


ENGINE_RECORD_FILE = "rollout_engine.json"
RECORDED_ARGS = (
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "sampling_backend",
    "tp_size",
    "ep_size",
    "mem_fraction_static",
    "dtype",
)


def engine_record(settings: EngineSettings) -> dict[str, Any]:
    """The engine's attention kernels and layout as the rollout starts it (a field SGLang picks
    itself shows as None), and why the measured decode default was left off, if it was."""
    record = {k: settings.kwargs.get(k) for k in RECORDED_ARGS}
    record["measured_decode_not_applied"] = settings.measured_decode_not_applied
    record["sglang"] = package_version("sglang")
    return record


def flashmla_kernel() -> Path | None:
    """The installed sglang-kernel's FlashMLA extension, found without importing sgl_kernel (which
    loads CUDA libraries); None when sglang-kernel is absent or was built without it."""
    spec = importlib.util.find_spec("sgl_kernel")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(folder).glob(FLASHMLA_KERNEL_GLOB))
        if found:
            return found[0]
    return None


def nvcc_found() -> bool:
    """Whether flashinfer's kernel builder finds nvcc (it looks at FLASHINFER_NVCC, CUDA_HOME /
    CUDA_PATH, the PATH, then /usr/local/cuda)."""
    if os.environ.get("FLASHINFER_NVCC") or shutil.which("nvcc"):
        return True
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    return Path(home, "bin", "nvcc").is_file()


def gpu_capability() -> tuple[int, int] | None:
    """Compute capability of this process's first visible GPU; None without one."""
    import torch

    return tuple(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None  # type: ignore[return-value]


def kernel_unusable(backend: str) -> str | None:
    """Why this machine cannot run a decode backend's kernels; None when it can (or for a backend
    SGLang ships built)."""
    if backend == FLASHMLA and flashmla_kernel() is None:
        return f"the installed sglang-kernel has no sgl_kernel/{FLASHMLA_KERNEL_GLOB}"
    if backend == FLASHINFER:
        if importlib.util.find_spec("flashinfer") is None:
            return "flashinfer is not installed"
        if importlib.util.find_spec("flashinfer_jit_cache") is None and not nvcc_found():
            return "flashinfer builds its MLA kernel at first use and finds neither nvcc nor flashinfer-jit-cache"
    return None


def measured_decode_unusable(backend: str, hf_config: dict) -> str | None:
    """Why the measured decode backend does not apply to this checkpoint here; None when it does."""
    dims = (hf_config.get("kv_lora_rank"), hf_config.get("qk_rope_head_dim"))
    if dims != MEASURED_MLA_DIMS:
        return (
            f"(kv_lora_rank, qk_rope_head_dim) = {dims}; the choice was measured for {MEASURED_MLA_DIMS} only"
        )
    capability = gpu_capability()
    if capability is None or capability[0] != 9:
        return f"GPU compute capability {capability}; the choice was measured on Hopper (9.x) only"
    return kernel_unusable(backend)


def uses_flashmla(kwargs: dict[str, Any]) -> bool:
    return FLASHMLA in (kwargs.get("attention_backend"), kwargs.get("decode_attention_backend"))


def check_flashmla(kwargs: dict[str, Any], where: str) -> None:
    """An engine asked for FlashMLA on a machine without the kernel: one message, before SGLang's
    scheduler dies on the missing extension."""
    if uses_flashmla(kwargs) and flashmla_kernel() is None:
        raise ValueError(
            f"{where}: rollout.sglang.attention_backend / decode_attention_backend = flashmla needs "
            f"sglang-kernel's FlashMLA extension (sgl_kernel/{FLASHMLA_KERNEL_GLOB}), which the installed "
            "sglang-kernel lacks; install the full sglang-kernel wheel or choose another backend"
        )


def measured_args(
    kwargs: dict[str, Any], measured: dict[str, Any], decode_unusable: str | None
) -> dict[str, Any]:
    """`measured` on top of the recipe's `kwargs`: a field the recipe set keeps its value, and a
    decode backend choice is left out where it cannot run (`decode_unusable` says why; the engine
    starts without it)."""
    chosen = {k: v for k, v in measured.items() if k not in kwargs}
    backend = chosen.get("decode_attention_backend")
    if backend and decode_unusable:
        logger.info("measured default decode_attention_backend=%s not applied: %s", backend, decode_unusable)
        chosen.pop("decode_attention_backend")
    if "decode_attention_backend" in chosen:  # SGLang's hybrid backend: prefill keeps the recipe's
        chosen["prefill_attention_backend"] = kwargs.get("attention_backend")
    return {**kwargs, **chosen}


def engine_settings(
    cfg: Config,
    *,
    model_path: str,
    hf_config: dict,
    colocated: bool,
    base_gpu_id: int = 0,
    needs_tokenizer: bool = False,
    measured: dict[str, Any] | None = None,
) -> EngineSettings:
    """The engine one rollout worker starts for this recipe and checkpoint (`hf_config`: its
    config.json). `measured` replaces MEASURED_ENGINE_ARGS (benchmarks measure against {})."""
    kwargs = engine_kwargs(
        cfg,
        model_path=model_path,
        colocated=colocated,
        base_gpu_id=base_gpu_id,
        needs_tokenizer=needs_tokenizer,
    )
    choices = MEASURED_ENGINE_ARGS if measured is None else measured
    backend = choices.get("decode_attention_backend")
    unusable = measured_decode_unusable(backend, hf_config) if backend else None
    kwargs = measured_args(kwargs, choices, unusable)
    env = moe_configs.engine_env(hf_config, kwargs["tp_size"], kwargs["ep_size"])
    env[HOOKS_SWITCH] = "1"  # rlinf's lighter sampler (sglang_hooks.py)
    # a decode backend in kwargs is the recipe's or the applied measured one: nothing left off
    return EngineSettings(kwargs, env, None if "decode_attention_backend" in kwargs else unusable)
