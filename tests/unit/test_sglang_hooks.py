"""rlinf's SGLang plugin (rlinf/workers/rollout/sglang_hooks.py): the light sampler draws what
torch.multinomial draws, the hook keeps SGLang's seeded path, the switch gates registration, and
a child process finds the entry point. That it never waits for the GPU is checked on the GPU
(tests/gpu/test_sglang_hooks_gpu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from rlinf.workers.rollout import sglang_hooks
from rlinf.workers.rollout.sglang_hooks import sample_from_probs, sampling_from_probs_hook


def _random_probs(rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    return torch.softmax(logits, dim=-1)


@pytest.mark.parametrize("rows,vocab", [(1, 7), (64, 1000), (5, 163840)])
def test_draws_the_tokens_torch_multinomial_draws(rows, vocab):
    probs = _random_probs(rows, vocab, seed=rows)
    for seed in range(3):
        torch.manual_seed(seed)
        reference = torch.multinomial(probs, 1).view(-1)
        torch.manual_seed(seed)
        ours = sample_from_probs(probs)
        assert ours.dtype == torch.int32 and ours.shape == (rows,)
        assert torch.equal(ours.long(), reference)


def test_frequencies_follow_the_distribution():
    probs = torch.tensor([[0.1, 0.6, 0.3, 0.0]]).expand(20000, 4).contiguous()
    torch.manual_seed(0)
    counts = torch.bincount(sample_from_probs(probs).long(), minlength=4).float() / 20000
    assert counts[3] == 0
    assert torch.allclose(counts, probs[0], atol=0.015)


def test_probs_are_not_modified():
    probs = _random_probs(4, 50, seed=1)
    before = probs.clone()
    sample_from_probs(probs)
    assert torch.equal(probs, before)  # SGLang takes log(probs) for the logprobs afterwards


def test_hook_keeps_sglangs_seeded_path():
    calls = []

    def original(probs, sampling_seed=None, positions=None):
        calls.append((sampling_seed, positions))
        return "seeded"

    probs = _random_probs(2, 10, seed=2)
    seed, positions = torch.tensor([1, 2]), torch.tensor([5, 6])
    assert sampling_from_probs_hook(original, probs, seed, positions) == "seeded"
    assert calls == [(seed, positions)]
    out = sampling_from_probs_hook(original, probs, None, positions)
    assert out.dtype == torch.int32 and len(calls) == 1


@pytest.fixture
def fake_hook_registry(monkeypatch):
    registered = []
    module = types.ModuleType("sglang.srt.plugins.hook_registry")

    class HookType:
        AROUND, AFTER = "around", "after"

    class HookRegistry:
        @staticmethod
        def register(target, hook, hook_type):
            registered.append((target, hook, hook_type))

    module.HookRegistry, module.HookType = HookRegistry, HookType
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", module)
    return registered


def test_register_acts_only_when_switched_on(fake_hook_registry, monkeypatch):
    monkeypatch.delenv(sglang_hooks.ENV_SWITCH, raising=False)
    sglang_hooks.register()
    assert fake_hook_registry == []
    monkeypatch.setenv(sglang_hooks.ENV_SWITCH, "1")
    sglang_hooks.register()
    assert fake_hook_registry == [
        (sglang_hooks.TARGET, sampling_from_probs_hook, "around"),
    ]


def test_target_names_sglangs_sampler_function():
    assert sglang_hooks.TARGET == "sglang.srt.layers.sampler.sampling_from_probs_torch"


CHILD = """
import importlib.metadata as m, json
eps = [e for e in m.entry_points(group="sglang.srt.plugins") if e.name == "rlinf_light_sampling"]
print(json.dumps({"values": [e.value for e in eps], "loads": eps[0].load().__name__ if eps else None}))
"""

PARENT = """
import json, os, subprocess, sys
from rlinf.workers.rollout.sglang_hooks import enable_for_children, make_discoverable
enable_for_children()
again = make_discoverable()  # already discoverable now: no second folder
out = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True, check=True).stdout
print(json.dumps({"child": json.loads(out), "again": again, "switch": os.environ["RLINF_SGLANG_HOOKS"]}))
"""


def test_children_find_the_entry_point(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", sglang_hooks.ENV_SWITCH)}
    # Started outside the repository, with rlinf importable only through this first sys.path entry.
    root = str(Path(sglang_hooks.__file__).resolve().parents[3])
    code = f"import sys; sys.path.insert(0, {root!r}); exec({PARENT!r})"
    done = subprocess.run(
        [sys.executable, "-c", code, CHILD],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["child"] == {
        "values": ["rlinf.workers.rollout.sglang_hooks:register"],
        "loads": "register",
    }
    assert result["again"] is None and result["switch"] == "1"
