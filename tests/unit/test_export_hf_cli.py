"""python -m rlinf.export_hf on a torch actor checkpoint: the folder round-trips the weights, and bad
input ends with one line, its exit code, no traceback and nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlinf.config import exit_codes
from rlinf.config.loader import save_resolved_config
from rlinf.config.schema import ActorConfig, Config, ModelConfig
from rlinf.utils.checkpoint import COMPLETE_MARKER

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    from rlinf.models.tiny import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("base"), bootstrap=False)


def torch_checkpoint(base_model: Path, root: Path) -> Path:
    """A complete step folder as RunCheckpointer writes it for the torch actor, with weights that
    differ from the base model's (as after training)."""
    from rlinf.models.hf_checkpoint import load_causal_lm

    step = root / "checkpoints" / "step_4"
    model = load_causal_lm(str(base_model))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.25)
    model.save_pretrained(step / "actor" / "model")
    shutil.copy(base_model / "tokenizer.json", step / "actor" / "model")
    shutil.copy(base_model / "tokenizer_config.json", step / "actor" / "model")
    cfg = Config(actor=ActorConfig(model=ModelConfig(model_path=str(base_model))))
    save_resolved_config(cfg, step)
    (step / COMPLETE_MARKER).write_text(json.dumps({"step": 4}))
    return step


def export(step: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "rlinf.export_hf", str(step), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def assert_one_line(proc: subprocess.CompletedProcess, code: int, label: str, *names: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{label}: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for name in names:
        assert name in lines[0], lines[0]


def test_torch_checkpoint_round_trips_through_the_export(base_model, tmp_path):
    from rlinf.models.hf_checkpoint import load_causal_lm, load_tokenizer

    step = torch_checkpoint(base_model, tmp_path)
    out = tmp_path / "exports" / "step_4-hf"
    proc = export(step, out)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["step_4-hf"]  # no temporary folder left
    got = load_causal_lm(str(out)).state_dict()
    want = load_causal_lm(str(step / "actor" / "model")).state_dict()
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    base = load_causal_lm(str(base_model)).state_dict()
    assert not torch.equal(got["lm_head.weight"], base["lm_head.weight"])  # the trained weights, not the base
    text = "12+7="
    assert load_tokenizer(str(out))(text)["input_ids"] == load_tokenizer(str(base_model))(text)["input_ids"]


def test_missing_step_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = export(tmp_path / "checkpoints" / "step_9", out)
    assert_one_line(proc, exit_codes.CHECKPOINT, "checkpoint error", "step_9", "does not exist")
    assert list(tmp_path.iterdir()) == []


def test_incomplete_step_is_refused(base_model, tmp_path):
    step = torch_checkpoint(base_model, tmp_path)
    (step / COMPLETE_MARKER).unlink()
    out = tmp_path / "out"
    proc = export(step, out)
    assert_one_line(proc, exit_codes.CHECKPOINT, "checkpoint error", "incomplete", COMPLETE_MARKER)
    assert not out.exists()


def test_existing_out_dir_is_left_untouched(base_model, tmp_path):
    step = torch_checkpoint(base_model, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = export(step, out)
    assert_one_line(proc, exit_codes.CONFIG, "config error", str(out), "already exists")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_failed_export_leaves_no_partial_folder(base_model, tmp_path):
    step = torch_checkpoint(base_model, tmp_path)
    weights = step / "actor" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated: found while the export runs
    exports = tmp_path / "exports"
    exports.mkdir()
    proc = export(step, exports / "step_4-hf")
    assert_one_line(proc, exit_codes.CHECKPOINT, "checkpoint error", "model.safetensors", "truncated")
    assert list(exports.iterdir()) == []
