"""Shared fixtures: a random-init tiny checkpoint (no warm start), one local Ray session, and a
finished two-step run to resume."""

import json
import shutil
import signal
import subprocess
import sys
import time
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


def sigterm_after_step_2(overrides: list[str], out: Path) -> tuple[Path, int, str]:
    """Start the tiny recipe in its own process, SIGTERM it once step 2 is logged, and check it
    stopped cleanly: exit 0, one complete checkpoint. (that checkpoint, its step, the output)."""
    main = Path(__file__).resolve().parents[2] / "examples/reasoning/main_grpo.py"
    proc = subprocess.Popen(
        [sys.executable, str(main), "tiny-moe-grpo-cpu", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=out,
    )
    lines = []
    deadline = time.time() + 240
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step 2/"):
            proc.send_signal(signal.SIGTERM)
            break
        assert time.time() < deadline, "".join(lines)
    rest, _ = proc.communicate(timeout=180)
    text = "".join(lines) + rest
    assert proc.returncode == 0, text
    assert "SIGTERM received" in text and "checkpoint saved to" in text and "Traceback" not in text
    checkpoints = sorted((out / "results" / "it" / "checkpoints").glob("step_*"))
    assert len(checkpoints) == 1 and (checkpoints[0] / "COMPLETE").is_file()
    stopped_at = json.loads((checkpoints[0] / "runner_state.json").read_text())["step"]
    assert stopped_at >= 2
    return checkpoints[0], stopped_at, text
