"""Tensors pickled after `import megatron.core` load in a process without megatron-core
(rlinf/models/megatron/pickling.py)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs megatron-core 0.19 (Python >= 3.12)")

# Unpickles stdin in a fresh interpreter where importing megatron fails, as on a reward worker.
LOADER = """
import pickle, sys
class NoMegatron:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "megatron":
            raise ImportError("megatron is not installed here")
sys.meta_path.insert(0, NoMegatron())
import torch
print(pickle.loads(sys.stdin.buffer.read())["x"].sum().item())
"""


def load_elsewhere(payload: bytes) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOADER], input=payload, capture_output=True, timeout=120)


def test_tensor_pickles_name_torch_not_megatron_and_load_without_it():
    import megatron.core  # noqa: F401  (replaces torch.storage._load_from_bytes)

    from rlinf.models.megatron.pickling import keep_tensor_pickles_portable

    batch = {
        "x": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "bf16": torch.ones(3, dtype=torch.bfloat16),
    }
    before = pickle.dumps(batch)
    assert b"megatron" in before  # what megatron-core does on its own
    refused = load_elsewhere(before)
    assert refused.returncode != 0 and b"megatron" in refused.stderr

    keep_tensor_pickles_portable()
    keep_tensor_pickles_portable()  # idempotent
    after = pickle.dumps(batch)
    assert b"megatron" not in after
    loaded = load_elsewhere(after)
    assert loaded.returncode == 0, loaded.stderr.decode()
    assert float(loaded.stdout) == 15.0
    # this process still loads storages through megatron-core's weights-only loader
    assert "safe_load_from_bytes" in torch.storage._load_from_bytes.__doc__
    round_trip = pickle.loads(after)
    assert torch.equal(round_trip["x"], batch["x"]) and round_trip["bf16"].dtype == torch.bfloat16
