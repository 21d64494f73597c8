"""ray_utils scripts on one machine: head start + address file, GPU check, worker wait timeout."""

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(script: str, *args: str, env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "ray_utils" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_worker_rank_waits_for_head_file_then_times_out(tmp_path):
    env = {**os.environ, "RANK": "1", "RAY_HEAD_IP_FILE": str(tmp_path / "head.txt"), "RAY_WAIT_TIMEOUT": "2"}
    proc = _run("start_ray.sh", env=env, timeout=30)
    assert proc.returncode == 1
    assert "no head address" in proc.stderr and "head.txt" in proc.stderr


def test_head_writes_address_and_check_ray_sees_the_cluster(tmp_path):
    port = _free_port()
    head_file = tmp_path / "head.txt"
    head_file.write_text("10.9.9.9\n")  # stale file from an earlier run must be replaced
    env = {
        **os.environ,
        "RANK": "0",
        "RAY_PORT": str(port),
        "RAY_HEAD_IP_FILE": str(head_file),
    }
    try:
        proc = _run("start_ray.sh", env=env)
        assert proc.returncode == 0, proc.stderr
        head_ip = head_file.read_text().strip()
        assert head_ip and head_ip != "10.9.9.9"
        check_env = {**env, "RAY_ADDRESS": f"{head_ip}:{port}", "CHECK_RAY_TIMEOUT": "5"}
        ready = _run("check_ray.sh", "0", env=check_env)
        assert ready.returncode == 0, ready.stderr
        assert "Ray cluster ready: 0 GPU(s)" in ready.stdout
        missing = _run("check_ray.sh", "8", env=check_env)
        assert missing.returncode == 1
        assert "reports 0 GPU(s)" in missing.stderr and "wanted 8" in missing.stderr
        # the runner finds the cluster through the same head file
        from rlinf.scheduler import cluster

        os.environ["RAY_HEAD_IP_FILE"] = str(head_file)
        os.environ["RAY_PORT"] = str(port)
        try:
            assert cluster.cluster_address() == f"{head_ip}:{port}"
        finally:
            del os.environ["RAY_HEAD_IP_FILE"], os.environ["RAY_PORT"]
    finally:
        # Stop exactly this cluster (its processes name its port); `ray stop` would also stop any
        # other Ray cluster on the machine, e.g. the test session's own.
        _kill_processes_mentioning(f":{port}", f"--gcs_server_port={port}")


def _kill_processes_mentioning(*texts: str) -> None:
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if any(text in cmdline for text in texts):
                os.kill(int(proc_dir.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue
