"""rlinf's SGLang plugin: a lighter sampler for every decode step of SGLang's scheduler.

Why: SGLang 0.5.12 samples without top-k / top-p / min-p (rlinf's RL sampling, temperature only)
with `torch.multinomial(probs, 1)`, which checks the whole [batch x vocab] probability tensor
(inf / NaN, negative, all-zero rows) before its exponential race, argmax(p / q) with q ~ Exp(1).
`sample_from_probs` runs the race alone: the same tokens for the same generator state
(tests/unit/test_sglang_hooks.py), less host and GPU time per decode step (docs/sglang.md). What
the checks caught, NaN or negative probabilities, comes from NaN logits, which SGLang's
`enable_nan_detection` guards. Seeded sampling (deterministic inference) keeps SGLang's path.

How it gets into SGLang: SGLang loads "general plugins" (entry-point group `sglang.srt.plugins`)
in each of its processes and applies the hooks they register (`HookRegistry`), the scheduler
included. `make_discoverable()` puts a small distribution record for this plugin on PYTHONPATH
(so an engine works the same whether rlinf is pip-installed or only on the path), and the plugin
acts only in processes started with RLINF_SGLANG_HOOKS=1 in their environment
(`enable_for_children`); any other SGLang program on the machine is left alone.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import tempfile
from pathlib import Path

import torch

PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "rlinf_light_sampling"
ENV_SWITCH = "RLINF_SGLANG_HOOKS"
TARGET = "sglang.srt.layers.sampler.sampling_from_probs_torch"
_DIST_NAME = "rlinf_sglang_hooks"


def sample_from_probs(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of `probs` [rows, vocab] (each row a distribution), as int32 [rows]:
    torch.multinomial(probs, 1)'s draw (the exponential race on the default generator), without
    its validity checks over the whole tensor."""
    race = torch.empty_like(probs).exponential_(1)
    torch.div(probs, race, out=race)
    return race.argmax(dim=-1).to(torch.int32)


def sampling_from_probs_hook(original, probs, sampling_seed=None, positions=None):
    """AROUND hook for SGLang's `sampling_from_probs_torch(probs, sampling_seed, positions)`."""
    if sampling_seed is not None:  # deterministic inference: SGLang's seeded path (no host read)
        return original(probs, sampling_seed=sampling_seed, positions=positions)
    return sample_from_probs(probs)


def register() -> None:
    """The entry point SGLang calls in each of its processes (sglang.srt.plugins.load_plugins)."""
    if os.environ.get(ENV_SWITCH) != "1":
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, sampling_from_probs_hook, HookType.AROUND)


def _already_discoverable() -> bool:
    return any(ep.name == PLUGIN_NAME for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP))


def make_discoverable() -> Path | None:
    """Make the entry point visible to this process and the ones it starts: a distribution record
    (`*.dist-info` with METADATA and entry_points.txt) in a fresh temporary folder put first on
    sys.path and PYTHONPATH. Returns the folder, or None when the entry point is already there."""
    if _already_discoverable():
        return None
    folder = Path(tempfile.mkdtemp(prefix="rlinf-sglang-plugin-"))
    info = folder / f"{_DIST_NAME}-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {_DIST_NAME}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\n{PLUGIN_NAME} = {__name__}:register\n")
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    # The plugin module itself must import in the children too: rlinf's folder goes along when
    # rlinf is importable only through the working directory (a site-packages install already is).
    package_root = str(Path(__file__).resolve().parents[3])
    extra = [] if package_root in sys.path else [package_root]
    paths = [str(folder), *extra, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return folder


def enable_for_children() -> None:
    """Called before starting an SGLang engine: its processes load and apply the hook."""
    make_discoverable()
    os.environ[ENV_SWITCH] = "1"
