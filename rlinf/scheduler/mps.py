"""A CUDA MPS control daemon for the run (`cluster.cuda_mps`).

Without MPS, the kernels of two processes on one GPU take the GPU in turns (time slices), so an
SGLang engine and an actor resident on the same GPU slow each other down instead of overlapping.
Under MPS their kernels run at once. The daemon is the run's own: its pipe and log folders live in a
fresh temporary folder, every process started after it (Ray's local workers inherit the driver's
environment) finds it through CUDA_MPS_PIPE_DIRECTORY, and it is told to quit when the run ends, so
nothing outside the run is affected.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlinf.config.typed import ConfigError
from rlinf.scheduler.cluster import MPS_ENV_KEYS

CONTROL = "nvidia-cuda-mps-control"


def control_binary() -> str | None:
    return shutil.which(CONTROL)


@contextmanager
def cuda_mps_daemon(enabled: bool) -> Iterator[Path | None]:
    """With `enabled`, start a private MPS control daemon, point this process's environment (and so
    every worker started from it) at it, and stop it on exit; yields its folder (None when off)."""
    if not enabled:
        yield None
        return
    control = control_binary()
    if control is None:
        raise ConfigError(f"cluster.cuda_mps: {CONTROL} is not on PATH (it comes with the NVIDIA driver)")
    root = Path(tempfile.mkdtemp(prefix="rlinf-mps-"))  # short: the pipe is a unix socket path
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
    for folder in env.values():
        Path(folder).mkdir()
    started = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True, text=True)
    if started.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise ConfigError(
            f"cluster.cuda_mps: {CONTROL} -d exited {started.returncode}: {(started.stderr or started.stdout).strip()}"
        )
    saved = {key: os.environ.get(key) for key in MPS_ENV_KEYS}
    os.environ.update(env)
    try:
        yield root
    finally:
        subprocess.run([control], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)
