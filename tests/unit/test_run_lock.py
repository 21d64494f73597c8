"""One writer per output folder (rlinf/utils/run_lock.py) and the folder checks before Ray starts."""

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf.config import load_config
from rlinf.runners.checkpointing import checkpoint_root
from rlinf.runners.output_setup import OutputFolderError, held_output_folders
from rlinf.utils.run_lock import LOCK_FILE, FolderInUseError, FolderLock

HOLD = "import sys, time; from rlinf.utils.run_lock import FolderLock; FolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)"


def _holder(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_naming_pid_and_host(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(FolderInUseError) as err:
            FolderLock(tmp_path).acquire()
        assert str(err.value).startswith(
            f"{tmp_path} is in use by another run (PID {holder.pid} on host {socket.gethostname()}, started "
        )
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_of_a_killed_run_is_taken_over_with_a_warning(tmp_path, caplog):
    holder = _holder(tmp_path)
    holder.kill()  # SIGKILL: the lock file stays, the kernel drops the lock
    holder.wait()
    assert (tmp_path / LOCK_FILE).is_file()
    lock = FolderLock(tmp_path)
    with caplog.at_level(logging.WARNING, logger="rlinf.utils.run_lock"):
        lock.acquire()
    assert (
        f"taking over the lock of a run that is gone without releasing it (PID {holder.pid} on host"
        in caplog.text
    )
    assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_FILE).read_text()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()  # a clean exit leaves nothing
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlinf.utils.run_lock"):
        FolderLock(tmp_path).acquire()
    assert "taking over" not in caplog.text


def _cfg(tmp_path: Path, *extra: str):
    return load_config(
        "tiny-moe-grpo-cpu",
        [f"runner.output_dir={tmp_path / 'results'}", f"runner.logger.log_path={tmp_path / 'logs'}", *extra],
    )


def test_held_folders_are_released_and_created_folders_left_empty_are_removed(tmp_path):
    cfg = _cfg(tmp_path)
    with held_output_folders(cfg):
        assert (checkpoint_root(cfg) / LOCK_FILE).is_file() and (tmp_path / "logs" / LOCK_FILE).is_file()
        with pytest.raises(OutputFolderError, match=r"^runner.output_dir: .* is in use by another run \(PID"):
            with held_output_folders(cfg):
                pass
    assert list(tmp_path.iterdir()) == []  # refused or not, a run that wrote nothing leaves nothing


def test_partial_saves_are_removed_and_a_checkpoint_that_will_not_fit_is_warned(
    tmp_path, caplog, monkeypatch
):
    import shutil

    from rlinf.models.tiny import build_tiny_checkpoint

    model = build_tiny_checkpoint(tmp_path / "model", bootstrap=False)
    cfg = _cfg(tmp_path, f"actor.model.model_path={model}")
    partial = checkpoint_root(cfg) / ".tmp_step_4"
    partial.mkdir(parents=True)
    (partial / "half.pt").write_bytes(b"x")
    (checkpoint_root(cfg) / ".rlinf_write_probe.1").write_bytes(b"")  # left by a run killed while probing
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=2**20))
    with caplog.at_level(logging.INFO), held_output_folders(cfg):
        left = sorted(p.name for p in checkpoint_root(cfg).iterdir())
    assert left == [LOCK_FILE]
    assert f"removed {partial}, a partial save an earlier run left" in caplog.text
    assert "has 1.0 MiB free, but a checkpoint takes about" in caplog.text
    assert "M parameters: fp32 weights + fp32 Adam moments" in caplog.text
