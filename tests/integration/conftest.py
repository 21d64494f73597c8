"""Shared fixtures: a random-init tiny checkpoint (no warm start), one local Ray session, and a
finished two-step run to resume."""

import shutil
from pathlib import Path

import pytest

from rlinf.config import load_config


@pytest.fixture(scope="session")
def random_tiny_checkpoint(tmp_path_factory) -> Path:
    from rlinf.models.tiny import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_random"), bootstrap=False)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from rlinf.scheduler.cluster import init_ray

    init_ray(0)
    yield
    ray.shutdown()


def small_run_overrides(checkpoint: Path, out: Path, **extra) -> list[str]:
    """A seconds-long GRPO run on the random tiny model."""
    overrides = {
        "actor.model.model_path": str(checkpoint),
        "runner.output_dir": str(out / "results"),
        "runner.logger.log_path": str(out / "logs"),
        "runner.max_steps": 3,
        "runner.val_check_interval": 2,
        "runner.save_interval": 0,
        "data.rollout_batch_size": 4,
        "data.synthetic.num_train": 64,
        "data.synthetic.num_val": 8,
        "algorithm.group_size": 4,
        "algorithm.sampling_params.max_new_tokens": 24,
        "actor.global_batch_size": 8,
        "actor.micro_batch_size": 4,
        "actor.seq_length": 96,
        "runner.experiment_name": "it",
    }
    overrides.update(extra)
    return [f"{k}={v}" for k, v in overrides.items()]


def small_config(checkpoint: Path, out: Path, **extra):
    return load_config("tiny-moe-grpo-cpu", small_run_overrides(checkpoint, out, **extra))


@pytest.fixture(scope="session")
def saved_run(random_tiny_checkpoint, tmp_path_factory, ray_session) -> Path:
    """A finished two-step run saved at both steps; each test gets a copy of its output folder
    (`copy_saved_run`) to spoil or to resume."""
    from rlinf.runners.main import run

    out = tmp_path_factory.mktemp("saved_run")
    assert (
        run(small_config(random_tiny_checkpoint, out, **{"runner.max_steps": 2, "runner.save_interval": 1}))
        == 0
    )
    return out


def copy_saved_run(saved_run: Path, tmp_path: Path) -> Path:
    """The latest checkpoint (step_2) of a copy of the saved run; step_1 is complete too."""
    shutil.copytree(saved_run, tmp_path, dirs_exist_ok=True)
    return tmp_path / "results" / "it" / "checkpoints" / "step_2"
