"""cluster.cuda_mps: the run's own MPS control daemon, started before Ray and told to quit after it.

The daemon here is a stand-in script named nvidia-cuda-mps-control that records how it was called
(no GPU on this machine); tests/gpu runs the real one."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf.config.typed import ConfigError
from rlinf.scheduler.mps import cuda_mps_daemon

STAND_IN = """#!/usr/bin/env bash
{{ echo "args=$*"; echo "pipe=$CUDA_MPS_PIPE_DIRECTORY"; [ -t 0 ] || [ "$*" = "-d" ] || echo "stdin=$(cat)"; }} >> {log}
[ "$*" = "-d" ] && [ -n "$FAKE_MPS_FAIL" ] && {{ echo "$FAKE_MPS_FAIL" >&2; exit 1; }}
exit 0
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> Path:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-cuda-mps-control"
    script.write_text(STAND_IN.format(log=log))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        monkeypatch.delenv(key, raising=False)
    return log


def test_the_daemon_serves_the_run_and_quits_after_it(stand_in):
    with cuda_mps_daemon(True) as root:
        pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
        assert pipe == str(root / "pipe") and Path(pipe).is_dir()
        assert os.environ["CUDA_MPS_LOG_DIRECTORY"] == str(root / "log")
        assert stand_in.read_text().splitlines() == ["args=-d", f"pipe={pipe}"]
    assert stand_in.read_text().splitlines()[2:] == ["args=", f"pipe={pipe}", "stdin=quit"]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and "CUDA_MPS_LOG_DIRECTORY" not in os.environ
    assert not root.exists()


def test_off_starts_nothing(stand_in):
    with cuda_mps_daemon(False) as root:
        assert root is None and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert not stand_in.exists()


def test_a_daemon_that_does_not_start_is_named_and_leaves_nothing(stand_in, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL", "An instance of this daemon is already running")
    with pytest.raises(ConfigError, match=r"-d exited 1: An instance of this daemon is already running"):
        with cuda_mps_daemon(True):
            pytest.fail("the run must not start")
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_a_machine_without_the_control_binary_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="cluster.cuda_mps: nvidia-cuda-mps-control is not on PATH"):
        with cuda_mps_daemon(True):
            pytest.fail("the run must not start")


def test_ray_workers_find_the_daemon(stand_in):
    """A fresh process, as the runner's: the daemon first, then a local Ray cluster whose worker
    reads the pipe folder (this test process may already hold a Ray cluster of another test)."""
    pytest.importorskip("ray")
    script = """
import os, ray
from rlinf.scheduler.cluster import init_ray, shutdown_ray
from rlinf.scheduler.mps import cuda_mps_daemon

@ray.remote(num_cpus=0)
def pipe_seen_by_a_worker():
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY")

with cuda_mps_daemon(True):
    assert init_ray(0)
    try:
        print("driver", os.environ["CUDA_MPS_PIPE_DIRECTORY"])
        print("worker", ray.get(pipe_seen_by_a_worker.remote()))
    finally:
        shutdown_ray()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = dict(
        line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("driver", "worker"))
    )
    assert seen["worker"] == seen["driver"] and seen["driver"].endswith("/pipe")


def test_init_ray_hands_the_daemon_to_the_workers_runtime_env(stand_in, monkeypatch):
    ray = pytest.importorskip("ray")
    from rlinf.scheduler import cluster

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(cluster, "cluster_address", lambda: None)
    with cuda_mps_daemon(True) as root:
        cluster.init_ray(1)
    env_vars = seen["runtime_env"]["env_vars"]
    assert env_vars["CUDA_MPS_PIPE_DIRECTORY"] == str(root / "pipe")
    assert env_vars["CUDA_MPS_LOG_DIRECTORY"] == str(root / "log")
