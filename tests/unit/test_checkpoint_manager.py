from pathlib import Path

import pytest

from rlinf.utils.checkpoint import (
    CheckpointError,
    CheckpointManager,
    CheckpointSaveError,
    check_complete,
    load_hf_weights_into,
)


def _write_file(name: str, text: str):
    def write(directory: Path) -> None:
        (directory / name).write_text(text)

    return write


def test_save_is_atomic_and_pruned(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        path = manager.save(step, _write_file("state.txt", f"step {step}"))
        assert path == tmp_path / f"step_{step}"
        check_complete(path)
    assert [p.name for p in manager.checkpoints()] == ["step_2", "step_3"]
    assert manager.latest().joinpath("state.txt").read_text() == "step 3"


def test_interrupted_save_leaves_previous_checkpoint_intact(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3)
    manager.save(1, _write_file("state.txt", "good"))

    def crash_halfway(directory: Path) -> None:
        (directory / "state.txt").write_text("half")
        raise KeyboardInterrupt("killed while writing")

    with pytest.raises(KeyboardInterrupt):
        manager.save(2, crash_halfway)
    assert manager.latest() == tmp_path / "step_1"
    assert (tmp_path / "step_1" / "state.txt").read_text() == "good"
    assert not (tmp_path / "step_2").exists()
    # the next successful save cleans the leftover temporary directory
    manager.save(3, _write_file("state.txt", "next"))
    assert not list(tmp_path.glob(".tmp_step_*"))


def test_incomplete_and_missing_checkpoints_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        check_complete(tmp_path / "step_9")
    half = tmp_path / "step_4"
    half.mkdir()
    with pytest.raises(CheckpointError, match=r"step_4: incomplete checkpoint"):
        check_complete(half)
    assert CheckpointManager(tmp_path, keep=1).latest() is None


def test_corrupt_weight_file_is_named(tmp_path):
    import torch

    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match=r"model.safetensors: corrupt weight file"):
        load_hf_weights_into(torch.nn.Linear(2, 2), tmp_path)
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_hf_weights_into(torch.nn.Linear(2, 2), tmp_path / "empty")


def test_replacing_a_step_keeps_a_complete_copy_at_every_moment(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep=2)
    manager.save(1, _write_file("state.txt", "first"))

    def write_while_checking(directory: Path) -> None:
        check_complete(tmp_path / "step_1")  # the old copy is untouched while the new one is written
        (directory / "state.txt").write_text("second")

    manager.save(1, write_while_checking)
    assert (tmp_path / "step_1" / "state.txt").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]

    # A crash between "old aside" and "new in": the old copy must survive and come back.
    real_rename = Path.rename

    def crash_on_moving_the_new_copy_in(self, target):
        if self.name.startswith(".tmp_step_"):
            raise KeyboardInterrupt("killed between the two renames")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", crash_on_moving_the_new_copy_in)
    with pytest.raises(KeyboardInterrupt):
        manager.save(1, _write_file("state.txt", "third"))
    monkeypatch.undo()
    restarted = CheckpointManager(tmp_path, keep=2)
    assert restarted.latest() == tmp_path / "step_1"
    assert (tmp_path / "step_1" / "state.txt").read_text() == "second"
    check_complete(tmp_path / "step_1")


def test_truncated_or_garbled_safetensors_are_named_before_loading(tmp_path):
    import torch
    from safetensors.torch import save_file

    from rlinf.utils.checkpoint import check_weight_files

    (tmp_path / "model").mkdir()
    good = tmp_path / "model" / "model.safetensors"
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(good))
    check_weight_files(tmp_path)  # intact: no error
    data = good.read_bytes()
    good.write_bytes(data[:-10])
    with pytest.raises(CheckpointError, match=r"model.safetensors: corrupt weight file: truncated"):
        check_weight_files(tmp_path)
    good.write_bytes(b"\xff" * 8 + data[8:])
    with pytest.raises(CheckpointError, match="header announces"):
        check_weight_files(tmp_path)
    good.write_bytes(data[:8] + b"{not json" + data[17:])
    with pytest.raises(CheckpointError, match="unreadable header"):
        check_weight_files(tmp_path)


def _failing(err: BaseException):
    def write(directory: Path) -> None:
        (directory / "half.bin").write_bytes(b"x" * 100)
        raise err

    return write


def test_a_failed_save_names_the_os_error_and_removes_its_partial_folder(tmp_path):
    import errno

    manager = CheckpointManager(tmp_path, keep=2)
    manager.save(1, _write_file("state.txt", "good"))
    full = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(CheckpointSaveError) as err:
        manager.save(2, _failing(full))
    assert str(err.value) == (
        f"saving step 2 to {tmp_path / 'step_2'} failed: [Errno 28] No space left on device; "
        "its partial folder was removed"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]
    assert (tmp_path / "step_1" / "state.txt").read_text() == "good"


def test_the_os_error_is_found_behind_a_workers_error(tmp_path):
    import errno

    from rlinf.scheduler.worker_group import WorkerError

    try:
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "x"))
    except OSError as cause:
        wrapped = WorkerError("actor worker (rank 0) failed: OSError: ...")
        wrapped.__cause__ = cause
    with pytest.raises(CheckpointSaveError, match=r"failed: \[Errno 30\] Read-only file system: '"):
        CheckpointManager(tmp_path, keep=1).save(3, _failing(wrapped))


def test_a_full_disk_reported_without_an_os_error_is_measured(tmp_path, monkeypatch):
    import shutil

    # torch.save reports a full disk as "RuntimeError: [enforce fail ...] unexpected pos": no errno.
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=4096))
    with pytest.raises(CheckpointSaveError) as err:
        CheckpointManager(tmp_path, keep=1).save(
            1, _failing(RuntimeError("unexpected pos 3588928 vs 3588820"))
        )
    assert "failed: [Errno 28] No space left on device: 0.0 MiB left on the filesystem of" in str(err.value)
    assert "(the writer said: unexpected pos 3588928 vs 3588820)" in str(err.value)
    monkeypatch.setattr(shutil, "disk_usage", real)  # plenty of space: the writer's own words
    with pytest.raises(
        CheckpointSaveError, match=r"failed: unexpected pos 1 vs 2; its partial folder was removed$"
    ):
        CheckpointManager(tmp_path, keep=1).save(1, _failing(RuntimeError("unexpected pos 1 vs 2")))
    assert not list(tmp_path.glob(".tmp_step_*"))
