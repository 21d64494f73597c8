"""runner.max_staleness: 1 end to end on Ray: the rollout generates ahead while the actor trains, no
row trains more than one version old, and the run loses nothing to a checkpoint, a resume or a
SIGTERM (the batches in flight are generated again after a resume, never saved)."""

import json
from pathlib import Path

import pytest

from rlinf.runners.main import run
from rlinf.utils.metrics import HISTORY_FILE
from tests.integration.conftest import sigterm_after_step_2, small_config, small_run_overrides

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BOUND_1 = {
    "runner.max_staleness": 1,
    "algorithm.rollout_is.mode": "token_tis",
    "runner.val_check_interval": 0,
    # the resumes below end sooner (runner.max_steps): a pinned decay keeps the LR schedule
    "actor.lr_sched.lr_decay_steps": 400,
}
PROMPTS_PER_STEP = 4  # small_run_overrides' data.rollout_batch_size


def _steps(logs: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (logs / HISTORY_FILE).read_text().splitlines()]
    return {row["step"]: row for row in rows if row["step"] > 0}


def _data_index(checkpoint: Path) -> int:
    return json.loads((checkpoint / "runner_state.json").read_text())["data"]["index"]


def test_a_checkpoint_mid_run_resumes_at_the_first_batch_not_trained(
    random_tiny_checkpoint, tmp_path, ray_session
):
    common = {**BOUND_1, "runner.max_steps": 4, "runner.save_interval": 2}
    assert run(small_config(random_tiny_checkpoint, tmp_path / "full", **common)) == 0
    full = _steps(tmp_path / "full" / "logs")
    assert sorted(full) == [1, 2, 3, 4]
    assert [full[s]["staleness/max"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 1.0, 1.0]  # ran ahead, within 1
    assert all(
        full[s]["staleness/dropped_samples"] == full[s]["staleness/regenerated_samples"] == 0 for s in full
    )
    root = tmp_path / "full" / "results" / "it" / "checkpoints"
    # at the step-2 save the producer had drawn step 3's prompts: the checkpoint does not count them
    assert _data_index(root / "step_2") == 2 * PROMPTS_PER_STEP
    assert _data_index(root / "step_4") == 4 * PROMPTS_PER_STEP

    # the same run stopped after step 2, then resumed with the same bound: it draws step 3's prompts again
    split = {**common, "runner.max_steps": 2}
    assert run(small_config(random_tiny_checkpoint, tmp_path / "split", **split)) == 0
    resumed = {**common, "runner.resume_dir": "auto"}
    assert run(small_config(random_tiny_checkpoint, tmp_path / "split", **resumed)) == 0
    steps = _steps(tmp_path / "split" / "logs")
    assert sorted(steps) == [1, 2, 3, 4]
    assert steps[3]["staleness/max"] == 0.0  # generated with the restored weights
    assert steps[4]["staleness/max"] <= 1.0
    split_root = tmp_path / "split" / "results" / "it" / "checkpoints"
    assert _data_index(split_root / "step_4") == _data_index(root / "step_4")


def test_sigterm_mid_run_saves_a_resumable_checkpoint_and_exits_zero(
    random_tiny_checkpoint, tmp_path, ray_session
):
    overrides = small_run_overrides(random_tiny_checkpoint, tmp_path, **{**BOUND_1, "runner.max_steps": 200})
    checkpoint, stopped_at, _ = sigterm_after_step_2(overrides, tmp_path)
    assert stopped_at < 200
    assert _data_index(checkpoint) == stopped_at * PROMPTS_PER_STEP  # the batches in flight dropped
    resumed = small_config(
        random_tiny_checkpoint,
        tmp_path,
        **{**BOUND_1, "runner.max_steps": stopped_at + 1, "runner.resume_dir": "auto"},
    )
    assert run(resumed) == 0
    last = tmp_path / "results" / "it" / "checkpoints" / f"step_{stopped_at + 1}"
    assert (last / "COMPLETE").is_file() and _data_index(last) == (stopped_at + 1) * PROMPTS_PER_STEP
