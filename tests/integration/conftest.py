"""Shared fixtures: a random-init tiny checkpoint (no warm start) and one local Ray session."""

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
