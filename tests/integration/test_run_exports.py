"""A 3-step run's outputs beyond checkpoints: Hugging Face folders every runner.export_hf_interval
steps (and after the last), the export tool on its checkpoint, and its wandb run (offline)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from rlinf.runners.main import run
from tests.integration.conftest import small_config

pytestmark = pytest.mark.slow

HAS_WANDB = importlib.util.find_spec("wandb") is not None
WANDB_KEYS = ("WANDB_MODE", "WANDB_DIR", "WANDB_SILENT")


@pytest.fixture(scope="module")
def finished_run(random_tiny_checkpoint, tmp_path_factory, ray_session):
    out = tmp_path_factory.mktemp("exports_run")
    backends = "[tensorboard,wandb]" if HAS_WANDB else "[tensorboard]"
    extra = {
        "runner.export_hf_interval": 2,
        "runner.save_interval": 1,  # checkpoints step_2 and step_3 (keep 2): what each export must hold
        "runner.val_check_interval": 0,
        "runner.logger.logger_backends": backends,
    }
    if HAS_WANDB:
        extra |= {"runner.logger.wandb.project": "rlinf-ci", "runner.logger.wandb.tags": "[tiny,ci]"}
    cfg = small_config(random_tiny_checkpoint, out, **extra)
    saved = {key: os.environ.pop(key, None) for key in WANDB_KEYS}
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    try:
        assert run(cfg) == 0
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value
    return cfg, out


def weights(folder) -> dict[str, torch.Tensor]:
    from rlinf.models.hf_checkpoint import load_causal_lm

    return load_causal_lm(str(folder)).state_dict()


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


def test_hf_folders_every_interval_and_after_the_last_step(finished_run, tmp_path):
    from rlinf.export_hf import main as export_main

    cfg, out = finished_run
    root = out / "results" / "it"
    exports = root / "hf"
    assert sorted(p.name for p in exports.iterdir()) == ["step_2", "step_3"]  # interval 2, and the end
    for step in (2, 3):
        assert_same(
            weights(exports / f"step_{step}"),
            weights(root / "checkpoints" / f"step_{step}" / "actor" / "model"),
        )
    assert (exports / "step_3" / "tokenizer.json").is_file()
    # The export tool on the run's final checkpoint writes the same weights.
    assert export_main([str(root / "checkpoints" / "step_3"), str(tmp_path / "hf")]) == 0
    assert_same(weights(tmp_path / "hf"), weights(exports / "step_3"))


@pytest.mark.skipif(
    not HAS_WANDB, reason="wandb not installed (bash requirements/install.sh embedded --wandb)"
)
def test_wandb_offline_run_holds_the_metrics_and_the_resolved_config(finished_run):
    from tests.unit.wandb_records import offline_run_file, read_offline_run

    cfg, out = finished_run
    wandb_run = read_offline_run(offline_run_file(out / "logs"))
    assert (wandb_run.project, wandb_run.name, wandb_run.tags) == ("rlinf-ci", "it", ["tiny", "ci"])
    assert wandb_run.config["runner"]["export_hf_interval"] == 2
    assert wandb_run.config["actor"]["model"]["model_path"] == cfg.actor.model.model_path
    history = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    by_step = {row["_step"]: row for row in wandb_run.history}
    assert sorted(by_step) == [0, 1, 2, 3]
    for row in history:
        for key, value in row.items():
            if key != "step":
                assert by_step[row["step"]][key] == pytest.approx(value, rel=1e-12), (row["step"], key)
