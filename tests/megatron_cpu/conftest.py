"""megatron-core on the CPU: one gloo process, world size 1, every parallel size 1.

Needs megatron-core 0.19 and megatron-bridge 0.6 (Python >= 3.12, the agentic stack). Without them
every test module here skips itself at import, with the reason, so the embedded CPU suite (Python
3.11, no megatron) collects and skips this directory. Run `python -m pytest -q tests/megatron_cpu`
with the megatron stack's Python (`bash requirements/install.sh megatron-cpu --venv DIR` makes one).

With RLINF_REQUIRE_MEGATRON=1 (CI's Python 3.12 run) every skip here is a failure instead: a
missing or broken megatron install, or a test that finds nothing to check, cannot pass as green.
"""

from __future__ import annotations

import os

import pytest
import torch

REQUIRE_MEGATRON = os.environ.get("RLINF_REQUIRE_MEGATRON") == "1"


def _fail_instead_of_skip(report, what: str) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = f"RLINF_REQUIRE_MEGATRON=1 forbids skips: {what} skipped ({reason})"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if REQUIRE_MEGATRON and report.skipped:
        _fail_instead_of_skip(report, collector.nodeid)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if REQUIRE_MEGATRON and report.skipped and not hasattr(report, "wasxfail"):
        _fail_instead_of_skip(report, item.nodeid)
    return report


@pytest.fixture(scope="session")
def model_parallel(tmp_path_factory):
    """torch.distributed (gloo, one rank) and megatron's model-parallel groups, all of size 1."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from rlinf.models.megatron import te_placeholder

    te_placeholder.install()  # before megatron-bridge is imported; a no-op where TE is real
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture
def cuda_device_is_cpu():
    """megatron-core's rotary embeddings and checkpoint writer ask torch.cuda for the current device
    (and synchronize it) even when everything is on the CPU: the device is "cpu", nothing to wait for."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "current_device", lambda: "cpu")
        patch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        yield


@pytest.fixture(scope="session")
def tiny_megatron_checkpoint(tmp_path_factory):
    """A random fp32 tiny DeepSeek-V3 (layer 0 dense, layers 1-2 MoE), vocab 64."""
    from actor_on_cpu import VOCAB

    from rlinf.models.tiny import TinyModelSettings, random_deepseek_v3

    out = tmp_path_factory.mktemp("tiny-megatron-deepseek-v3")
    random_deepseek_v3(TinyModelSettings(num_hidden_layers=3), vocab_size=VOCAB).save_pretrained(out)
    return out


@pytest.fixture
def on_cpu(model_parallel):
    """megatron-core's CUDA allocations, streams and type checks on the CPU (cuda_on_cpu.py)."""
    from cuda_on_cpu import cuda_on_cpu

    with cuda_on_cpu():
        yield
