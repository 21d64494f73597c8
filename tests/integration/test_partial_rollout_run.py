"""data.partial_rollout through the whole loop: every step trains rollout_batch_size whole groups,
the groups left unfinished are carried (and checkpointed), and a resumed run repeats the
uninterrupted one."""

import json

import pytest

from rlinf.runners.checkpointing import CARRIED_GROUPS_FILE, RUNNER_STATE_FILE
from rlinf.runners.main import run
from rlinf.utils.metrics import HISTORY_FILE
from tests.integration.conftest import small_config

pytestmark = pytest.mark.slow

PARTIAL = {
    "data.oversample_prompts": 2,
    "data.partial_rollout": True,
    "runner.max_steps": 4,
    "runner.save_interval": 2,
    "runner.val_check_interval": 0,
    "actor.optim.lr": 1e-2,
    "actor.lr_sched.lr_decay_steps": 8,  # the split run below stops at step 2 with the same LR schedule
}


def _steps(logs) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (logs / HISTORY_FILE).read_text().splitlines()]
    steps: dict[int, dict[str, float]] = {}
    for row in rows:
        if row["step"] > 0:  # step 0 holds the run's setup figures
            steps.setdefault(row["step"], {}).update(
                {k: v for k, v in row.items() if not k.startswith(("time/", "throughput/"))}
            )
    return steps


def test_partial_rollout_trains_whole_batches_and_resumes_exactly(
    random_tiny_checkpoint, tmp_path, ray_session
):
    assert run(small_config(random_tiny_checkpoint, tmp_path / "full", **PARTIAL)) == 0
    full = _steps(tmp_path / "full" / "logs")
    assert sorted(full) == [1, 2, 3, 4]
    for metrics in full.values():
        assert metrics["rollout/num_responses"] == 16  # rollout_batch_size 4 x group_size 4
        assert abs(metrics["advantages/mean"]) < 1e-6  # whole groups: each centred on its mean
        assert metrics["rollout/carried_groups"] == 2  # 4 + 2 groups in flight, 4 trained
    assert full[1]["rollout/carried_tokens"] == 0 and full[1]["rollout/max_carry_steps"] == 1
    assert any(m["rollout/carried_tokens"] > 0 for m in full.values())  # carried responses were trained
    root = tmp_path / "full" / "results" / "it" / "checkpoints"
    # 6 fresh prompts at step 1, then 4 a step (2 groups carried in)
    assert json.loads((root / "step_2" / RUNNER_STATE_FILE).read_text())["data"]["index"] == 10
    assert len(json.loads((root / "step_2" / CARRIED_GROUPS_FILE).read_text())) == 2

    # the same run stopped after step 2, then resumed from its checkpoint
    assert (
        run(small_config(random_tiny_checkpoint, tmp_path / "split", **{**PARTIAL, "runner.max_steps": 2}))
        == 0
    )
    resumed = {**PARTIAL, "runner.resume_dir": "auto"}
    assert run(small_config(random_tiny_checkpoint, tmp_path / "split", **resumed)) == 0
    split = _steps(tmp_path / "split" / "logs")
    for step in (3, 4):
        assert split[step] == full[step], f"step {step} differs after resume"
    split_root = tmp_path / "split" / "results" / "it" / "checkpoints"
    for name in (RUNNER_STATE_FILE, CARRIED_GROUPS_FILE):
        assert (split_root / "step_4" / name).read_text() == (root / "step_4" / name).read_text()
