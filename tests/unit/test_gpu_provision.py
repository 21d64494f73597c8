"""tests/gpu/provision.sh on a machine provisioned from wheel folders: what the checks build once
(GPU-tiny's warm start, the kernels compiled at first use) is kept under /tmp, which lasts between
the machine's commands where $HOME may not; a machine set up otherwise keeps its own defaults."""

from __future__ import annotations

import subprocess
from pathlib import Path

PROVISION = Path(__file__).parents[1] / "gpu" / "provision.sh"
CACHES = ("RLINF_CACHE_DIR", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "TORCH_EXTENSIONS_DIR")


def _caches_after_provision(site: Path, **preset: str) -> dict[str, str]:
    script = f"source {PROVISION} && use_wheel_folders && " + " && ".join(
        f'echo "{name}=${{{name}:-}}"' for name in CACHES
    )
    env = {"PATH": "/usr/bin:/bin", "RLINF_KIT_SITE": str(site), **preset}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


def test_a_provisioned_machine_keeps_caches_and_compiled_kernels_under_tmp(tmp_path):
    (tmp_path / "env.sh").write_text("export PYTHONPATH=/somewhere\n")
    assert _caches_after_provision(tmp_path) == {
        "RLINF_CACHE_DIR": "/tmp/rlinf-cache",
        "TRITON_CACHE_DIR": "/tmp/kernel-cache/triton",
        "FLASHINFER_WORKSPACE_BASE": "/tmp/kernel-cache",
        "TORCH_EXTENSIONS_DIR": "/tmp/kernel-cache/torch_extensions",
    }


def test_caches_set_outside_are_kept(tmp_path):
    (tmp_path / "env.sh").write_text("")
    preset = {name: f"/mine/{name}" for name in CACHES}
    assert _caches_after_provision(tmp_path, **preset) == preset


def test_a_machine_not_provisioned_from_wheel_folders_keeps_its_defaults(tmp_path):
    assert _caches_after_provision(tmp_path) == dict.fromkeys(CACHES, "")
