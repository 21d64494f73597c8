import pytest
import torch

from rlinf.data.batch import RolloutBatch
from rlinf.runners.step_metrics import pass_at_k, rollout_metrics
from rlinf.utils.metrics import MetricLogger, progress_line
from rlinf.utils.plot import plot_training_curves


def test_tensorboard_events_and_history(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricLogger(tmp_path, ("tensorboard",))
    for step in range(1, 4):
        logger.log({"rollout/reward_mean": step * 0.5, "val/accuracy": 0.1 * step, "bad": float("nan")}, step)
    logger.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [e.value for e in events.Scalars("rollout/reward_mean")] == [0.5, 1.0, 1.5]
    assert "bad" not in events.Tags()["scalars"]
    assert [row["step"] for row in logger.history()] == [1, 2, 3]
    logger.truncate_after(2)
    assert [row["step"] for row in logger.history()] == [1, 2]
    png = plot_training_curves(logger.history(), tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_purges_the_redone_steps_from_tensorboard(tmp_path):
    """A run that crashed after logging step 4 resumes from the step-2 checkpoint: TensorBoard must
    show steps 3 and 4 once, with the resumed run's values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = MetricLogger(tmp_path, ("tensorboard",))
    for step in range(1, 5):
        first.log({"rollout/reward_mean": float(step)}, step)
    first.close()
    resumed = MetricLogger(tmp_path, ("tensorboard",))
    resumed.truncate_after(2)
    for step in (3, 4):
        resumed.log({"rollout/reward_mean": 10.0 * step}, step)
    resumed.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    points = [(e.step, e.value) for e in events.Scalars("rollout/reward_mean")]
    assert points == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def _batch(correct: list[bool], lengths: list[int], reasons: list[str]) -> RolloutBatch:
    n, width = len(correct), max(lengths)
    mask = torch.tensor([[i < length for i in range(width)] for length in lengths])
    return RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.bool),
        response_ids=torch.ones(n, width, dtype=torch.long),
        response_mask=mask,
        group_index=torch.tensor([0, 0, 1, 1]),
        rollout_logprobs=torch.zeros(n, width),
        finish_reasons=reasons,
        response_text=[""] * n,
        solutions=[("1",)] * n,
        rewards=torch.tensor([5.0 if c else -5.0 for c in correct]),
        correct=torch.tensor(correct),
        extras={"reward/timeouts": 1.0},
    )


def test_rollout_metrics_known_values():
    batch = _batch([True, False, False, False], [2, 4, 3, 1], ["stop", "length", "stop", "stop"])
    m = rollout_metrics(batch)
    assert m["rollout/reward_mean"] == -2.5
    assert m["rollout/accuracy"] == 0.25
    assert m["rollout/response_length_mean"] == 2.5
    assert m["rollout/response_length_max"] == 4
    assert m["rollout/truncated_fraction"] == 0.25
    assert m["reward/timeouts"] == 1.0
    assert "acc 0.250" in progress_line(3, 10, m, 12.0)


def test_pass_at_k():
    correct = torch.tensor([True, False, False, False, True, True])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    mean_k, pass_k = pass_at_k(correct, groups)
    assert mean_k == 0.5
    assert abs(pass_k - 2 / 3) < 1e-7


def test_validation_chunks_merge_without_group_collisions():
    from types import SimpleNamespace

    from rlinf.runners.step_metrics import merged_scores

    # Two generate calls (data.val_batch_size=2), each numbering its groups from 0.
    first = SimpleNamespace(
        correct=torch.tensor([True, False, False, False]), group_index=torch.tensor([0, 0, 1, 1])
    )
    second = SimpleNamespace(
        correct=torch.tensor([False, False, False, True]), group_index=torch.tensor([0, 0, 1, 1])
    )
    correct, groups = merged_scores([first, second])
    assert groups.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    mean_k, pass_k = pass_at_k(correct, groups)
    assert (mean_k, pass_k) == (0.25, 0.5)  # colliding ids would have given pass@2 = 1.0


def test_wandb_offline_run_holds_every_logged_step_and_the_run_settings(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra: bash requirements/install.sh embedded --wandb")
    from rlinf.utils.wandb_sink import WandbRun
    from tests.unit.wandb_records import offline_run_file, read_offline_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    config = {"runner": {"seed": 7}, "algorithm": {"group_size": 4}}
    logger = MetricLogger(tmp_path, ("wandb",), WandbRun("proj", "exp", ("a", "b"), config))
    for step in range(1, 4):
        logger.log({"rollout/reward_mean": step * 0.5, "bad": float("nan")}, step)
    logger.close()
    run = read_offline_run(offline_run_file(tmp_path))
    assert (run.project, run.name, run.tags) == ("proj", "exp", ["a", "b"])
    assert run.config["runner"] == {"seed": 7} and run.config["algorithm"] == {"group_size": 4}
    assert [(row["_step"], row["rollout/reward_mean"]) for row in run.history] == [
        (1, 0.5),
        (2, 1.0),
        (3, 1.5),
    ]
    assert not any("bad" in row for row in run.history)
    assert not (tmp_path / "events.out.tfevents").exists() and not list(tmp_path.glob("events.*"))


def test_wandb_chosen_without_the_package_names_the_install_command(monkeypatch):
    import importlib.util

    from rlinf.config import load_config
    from rlinf.workers.backends import BackendUnavailableError, check_backends

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    cfg = load_config("tiny-moe-grpo-cpu", ["runner.logger.logger_backends=[tensorboard,wandb]"])
    with pytest.raises(BackendUnavailableError, match="install.sh embedded --wandb"):
        check_backends(cfg)
