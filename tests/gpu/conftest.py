"""GPU tier: every test here is marked `gpu` and skips, with the reason, where the machine lacks
what it needs (a CUDA device, SGLang, megatron-core). Checkpoints are built here, on the GPU,
once per session: the Moonlight slice is 5 GB, too big to carry to a lent machine."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.gpu)


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture(scope="session")
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible to torch)")
    return torch.device("cuda")


@pytest.fixture(scope="session")
def sglang_installed(cuda) -> None:
    if not _have("sglang"):
        pytest.skip("needs sglang 0.5.12 (bash requirements/install.sh agentic ...)")


@pytest.fixture(scope="session")
def megatron_installed(cuda) -> None:
    if not _have("megatron.core"):
        pytest.skip(
            "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
        )


@pytest.fixture(scope="session")
def gpu_dir(tmp_path_factory) -> Path:
    return Path(os.environ.get("RLINF_GPU_TEST_DIR") or tmp_path_factory.mktemp("gpu-checkpoints"))


@pytest.fixture(scope="session")
def moonlight_slice(cuda, gpu_dir) -> Path:
    """The 4-layer Moonlight-shaped slice, random bf16 (built once per session, reused if present)."""
    from rlinf.models.slice import build_moonlight_slice

    out = gpu_dir / "moonlight-slice-4l"
    if not (out / "slice_build.json").is_file():
        build_moonlight_slice(out, 4, dtype="bf16", device="cuda")
    return out


@pytest.fixture(scope="session")
def gpu_tiny(cuda, gpu_dir) -> Path:
    """The tiny model at SGLang-compatible MLA dims, random init, with its char tokenizer."""
    from rlinf.models.tiny import GPU_TINY_SETTINGS, build_tiny_checkpoint

    out = gpu_dir / "gpu-tiny-random"
    if not (out / "tiny_build.json").is_file():
        build_tiny_checkpoint(out, GPU_TINY_SETTINGS, bootstrap=False)
    return out
