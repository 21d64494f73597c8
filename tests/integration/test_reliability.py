"""Runs that survive: resume equality, signals, dead workers, NaN steps, corrupt checkpoints."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlinf.runners.main import run
from rlinf.utils.metrics import HISTORY_FILE
from tests.integration.conftest import small_config, small_run_overrides

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _history(logs: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (logs / HISTORY_FILE).read_text().splitlines()]
    merged: dict[int, dict[str, float]] = {}
    for row in rows:
        merged.setdefault(row["step"], {}).update(row)
    return merged


def _comparable(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith(("time/", "throughput/"))}


def test_resumed_run_repeats_the_uninterrupted_one(random_tiny_checkpoint, tmp_path, ray_session):
    common = {"runner.max_steps": 4, "runner.save_interval": 2, "actor.optim.lr": 1e-2}
    assert run(small_config(random_tiny_checkpoint, tmp_path / "full", **common)) == 0
    # the same run, stopped after step 2 ...
    assert (
        run(small_config(random_tiny_checkpoint, tmp_path / "split", **{**common, "runner.max_steps": 2}))
        == 0
    )
    # ... and resumed from its latest checkpoint
    resumed = small_config(
        random_tiny_checkpoint, tmp_path / "split", **{**common, "runner.resume_dir": "auto"}
    )
    assert run(resumed) == 0
    full, split = _history(tmp_path / "full" / "logs"), _history(tmp_path / "split" / "logs")
    for step in (3, 4):
        assert _comparable(split[step]) == _comparable(full[step]), f"step {step} differs after resume"
    assert "actor/policy_loss" in split[4]


def test_dead_worker_stops_the_run_naming_the_role(random_tiny_checkpoint, tmp_path, ray_session):
    from rlinf.models.loader import load_tokenizer
    from rlinf.runners.data_setup import build_datasets
    from rlinf.runners.grpo_runner import GRPORunner
    from rlinf.runners.main import describe_failure
    from rlinf.scheduler.roles import launch_roles
    from rlinf.scheduler.worker_group import WorkerDiedError
    from rlinf.utils.metrics import MetricLogger

    cfg = small_config(random_tiny_checkpoint, tmp_path, **{"runner.val_check_interval": 0})
    train, val, _ = build_datasets(cfg, load_tokenizer(str(random_tiny_checkpoint)))
    roles = launch_roles(cfg)
    try:
        runner = GRPORunner(cfg, roles, train, val, MetricLogger(tmp_path / "logs", ()))
        os.kill(roles.rollout.pids()[0], signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match=r"rollout worker \(rank 0\) died") as err:
            runner.run()
        message = describe_failure(err.value, runner.checkpointer.last_saved)
        assert "rollout worker" in message and "last good checkpoint: none" in message
    finally:
        roles.shutdown()


def test_sigterm_saves_a_resumable_checkpoint_and_exits_zero(random_tiny_checkpoint, tmp_path, ray_session):
    overrides = small_run_overrides(
        random_tiny_checkpoint, tmp_path, **{"runner.max_steps": 200, "runner.val_check_interval": 0}
    )
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "examples/reasoning/main_grpo.py"), "tiny-moe-grpo-cpu", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    lines = []
    deadline = time.time() + 240
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step 2/"):
            proc.send_signal(signal.SIGTERM)
            break
        assert time.time() < deadline, "".join(lines)
    out, _ = proc.communicate(timeout=180)
    text = "".join(lines) + out
    assert proc.returncode == 0, text
    assert "SIGTERM received" in text and "checkpoint saved to" in text
    checkpoints = sorted((tmp_path / "results" / "it" / "checkpoints").glob("step_*"))
    assert len(checkpoints) == 1 and (checkpoints[0] / "COMPLETE").is_file()
    stopped_at = json.loads((checkpoints[0] / "runner_state.json").read_text())["step"]
    assert 2 <= stopped_at < 200
    # the checkpoint resumes: the run continues after the step it stopped at
    resumed = small_config(
        random_tiny_checkpoint,
        tmp_path,
        **{"runner.max_steps": stopped_at + 1, "runner.val_check_interval": 0, "runner.resume_dir": "auto"},
    )
    assert run(resumed) == 0
    assert (tmp_path / "results" / "it" / "checkpoints" / f"step_{stopped_at + 1}" / "COMPLETE").is_file()


def test_corrupt_checkpoint_on_resume_names_the_file(random_tiny_checkpoint, tmp_path, ray_session, capsys):
    assert run(small_config(random_tiny_checkpoint, tmp_path, **{"runner.max_steps": 1})) == 0
    checkpoint = tmp_path / "results" / "it" / "checkpoints" / "step_1"
    weights = checkpoint / "actor" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    resumed = small_config(
        random_tiny_checkpoint, tmp_path, **{"runner.max_steps": 2, "runner.resume_dir": "auto"}
    )
    assert run(resumed) == 1  # stops with the message; nothing new is written
    message = capsys.readouterr().err
    assert f"{weights}: corrupt weight file" in message
    assert "last good checkpoint: none" in message  # the corrupt one is not offered as good
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["step_1"]


def test_incompatible_checkpoint_is_refused(random_tiny_checkpoint, tmp_path, ray_session):
    from rlinf.utils.checkpoint import CheckpointError

    assert run(small_config(random_tiny_checkpoint, tmp_path, **{"runner.max_steps": 1})) == 0
    other = small_config(
        random_tiny_checkpoint, tmp_path, **{"runner.resume_dir": "auto", "algorithm.group_size": 2}
    )
    with pytest.raises(
        CheckpointError, match=r"resolved_config.yaml: incompatible checkpoint: algorithm.group_size"
    ):
        run(other)
