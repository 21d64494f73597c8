"""Runs that survive: resume equality, signals, dead workers, NaN steps, corrupt checkpoints."""

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from rlinf.runners.main import run
from rlinf.utils.metrics import HISTORY_FILE
from tests.integration.conftest import sigterm_after_step_2, small_config, small_run_overrides

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


def _rows(logs: Path) -> list[dict]:
    return [json.loads(line) for line in (logs / HISTORY_FILE).read_text().splitlines()]


def test_resumed_run_repeats_the_uninterrupted_one(
    random_tiny_checkpoint, tmp_path, ray_session, capsys, caplog
):
    """A 4-step run stopped after step 2 and resumed with the same config repeats the uninterrupted
    run, the recipe's cosine decaying over runner.max_steps x 2 optimizer steps throughout."""
    import logging

    caplog.set_level(logging.INFO, logger="rlinf.runners.checkpointing")
    common = {"runner.max_steps": 4, "runner.save_interval": 2, "actor.optim.lr": 1e-2}
    assert run(small_config(random_tiny_checkpoint, tmp_path / "full", **common)) == 0
    saves = [r.getMessage() for r in caplog.records if r.getMessage().startswith("saved checkpoint")]
    # the last step falls on save_interval: saved once
    assert [save.rsplit("/", 1)[-1] for save in saves] == ["step_2", "step_4"], saves
    # the same run stopped after step 2 left its step_2 checkpoint and its metric rows up to step 2
    shutil.copytree(tmp_path / "full", tmp_path / "split")
    root = tmp_path / "split" / "results" / "it" / "checkpoints"
    shutil.rmtree(root / "step_4")
    history = tmp_path / "split" / "logs" / HISTORY_FILE
    kept = [line for line in history.read_text().splitlines() if json.loads(line)["step"] <= 2]
    history.write_text("".join(f"{line}\n" for line in kept))
    stopped = json.loads((root / "step_2" / "runner_state.json").read_text())
    assert stopped["step"] == 2 and stopped["data"]["index"] == 2 * 4  # rollout_batch_size 4
    assert stopped["lr_schedule"] == {
        "style": "cosine",
        "peak_lr": 1e-2,
        "warmup_steps": 2,
        "decay_steps": 8,  # the recipe's lr_decay_steps: null, so runner.max_steps x 2 optimizer steps
        "min_lr": pytest.approx(1e-3),
        "optimizer_steps": 4,
    }
    capsys.readouterr()
    # ... and resumed from its latest checkpoint
    resumed = small_config(
        random_tiny_checkpoint, tmp_path / "split", **{**common, "runner.resume_dir": "auto"}
    )
    assert run(resumed) == 0
    out = capsys.readouterr().out
    assert f"resumed from {root / 'step_2'} at step 2 (data epoch 0, index 8); continuing with step 3" in out
    assert "step 3/4" in out and "step 1/4" not in out  # it did not start over
    # one row per step, exactly as the uninterrupted run wrote them (no step logged twice)
    full_rows, split_rows = _rows(tmp_path / "full" / "logs"), _rows(tmp_path / "split" / "logs")
    assert [r["step"] for r in split_rows] == [r["step"] for r in full_rows]
    assert [r["step"] for r in split_rows if r["step"] > 0] == [1, 2, 3, 4]
    full, split = _history(tmp_path / "full" / "logs"), _history(tmp_path / "split" / "logs")
    for step in (3, 4):
        assert _comparable(split[step]) == _comparable(full[step]), f"step {step} differs after resume"
    assert split[3]["actor/lr"] == full[3]["actor/lr"] < 1e-2  # the cosine schedule continued
    # the data position continued too: the final checkpoints hold the same loader state
    full_state = json.loads(
        (tmp_path / "full" / "results" / "it" / "checkpoints" / "step_4" / "runner_state.json").read_text()
    )
    assert json.loads((root / "step_4" / "runner_state.json").read_text()) == full_state


def test_worker_killed_after_a_checkpoint_names_that_checkpoint(
    random_tiny_checkpoint, tmp_path, ray_session, monkeypatch, capsys
):
    from rlinf.runners.checkpointing import RunCheckpointer

    saved = RunCheckpointer.save

    def save_then_kill_the_rollout(self, step, carried=()):
        path = saved(self, step, carried)
        os.kill(self.roles.rollout.pids()[0], signal.SIGKILL)
        return path

    monkeypatch.setattr(RunCheckpointer, "save", save_then_kill_the_rollout)
    cfg = small_config(
        random_tiny_checkpoint, tmp_path, **{"runner.save_interval": 1, "runner.val_check_interval": 0}
    )
    assert run(cfg) == 1
    err = capsys.readouterr().err
    checkpoint = tmp_path / "results" / "it" / "checkpoints" / "step_1"
    assert "rollout worker (rank 0) died" in err
    assert f"last good checkpoint: {checkpoint}" in err
    assert (checkpoint / "COMPLETE").is_file()
    assert "Traceback" not in err


def test_dead_worker_stops_the_run_naming_the_role(random_tiny_checkpoint, tmp_path, ray_session):
    from rlinf.models.hf_checkpoint import load_tokenizer
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
    # The resume below ends the run sooner (runner.max_steps): a pinned decay keeps the LR schedule.
    pinned = {"runner.val_check_interval": 0, "actor.lr_sched.lr_decay_steps": 400}
    overrides = small_run_overrides(random_tiny_checkpoint, tmp_path, **{"runner.max_steps": 200, **pinned})
    _, stopped_at, _ = sigterm_after_step_2(overrides, tmp_path)
    assert stopped_at < 200
    # the checkpoint resumes: the run continues after the step it stopped at
    resumed = small_config(
        random_tiny_checkpoint,
        tmp_path,
        **{"runner.max_steps": stopped_at + 1, "runner.resume_dir": "auto", **pinned},
    )
    assert run(resumed) == 0
    assert (tmp_path / "results" / "it" / "checkpoints" / f"step_{stopped_at + 1}" / "COMPLETE").is_file()


def test_save_at_end_false_trains_without_writing_a_checkpoint(random_tiny_checkpoint, tmp_path, ray_session):
    cfg = small_config(
        random_tiny_checkpoint,
        tmp_path,
        **{"runner.max_steps": 2, "runner.val_check_interval": 0, "runner.save_at_end": "false"},
    )
    assert run(cfg) == 0
    logged = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "time/step" in r] == [1, 2]
    assert not list((tmp_path / "results").glob("**/step_*"))
