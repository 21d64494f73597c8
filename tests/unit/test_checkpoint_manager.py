from pathlib import Path

import pytest

from rlinf.utils.checkpoint import CheckpointError, CheckpointManager, check_complete, load_hf_weights_into


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
