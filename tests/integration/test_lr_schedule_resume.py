"""Extending a finished 2-step run to 4 steps, whose cosine decays over runner.max_steps (the tiny
recipe): actor.lr_sched.on_resume=use_checkpoint keeps the first run's schedule, override follows
the 4-step plan from step 3 on (the refusal without the key is in test_bad_input.py)."""

import json

import pytest

from rlinf.algorithms.lr_schedule import lr_multiplier
from rlinf.runners.main import run
from rlinf.utils.metrics import HISTORY_FILE
from tests.integration.conftest import copy_saved_run, small_config

pytestmark = pytest.mark.slow
OPTIMIZER_STEPS_PER_STEP = 2  # 4 prompts x 4 responses, 8 per minibatch


@pytest.mark.parametrize(("on_resume", "decay_steps"), [("use_checkpoint", 4), ("override", 8)])
def test_extended_run_follows_the_chosen_lr_schedule(
    saved_run, random_tiny_checkpoint, tmp_path, ray_session, caplog, on_resume, decay_steps
):
    import logging

    copy_saved_run(saved_run, tmp_path)
    extended = small_config(
        random_tiny_checkpoint,
        tmp_path,
        **{"runner.max_steps": 4, "runner.resume_dir": "auto", "actor.lr_sched.on_resume": on_resume},
    )
    with caplog.at_level(logging.INFO, logger="rlinf.runners.lr_resume"):
        assert run(extended) == 0
    chosen = [m for m in caplog.messages if m.startswith(f"actor.lr_sched.on_resume={on_resume}:")]
    assert len(chosen) == 1, caplog.messages
    rows = [json.loads(line) for line in (tmp_path / "logs" / HISTORY_FILE).read_text().splitlines()]
    lr = {row["step"]: row["actor/lr"] for row in rows if "actor/lr" in row}
    # the tiny recipe: 2 warmup steps, then a cosine to 0.1 x the peak over `decay_steps`
    at = lr_multiplier("cosine", 2, decay_steps, 0.1)
    peak = extended.actor.optim.lr
    # actor/lr: the rate after the step's optimizer steps (step 3 ends after optimizer step 6)
    for step in (3, 4):
        assert lr[step] == pytest.approx(peak * at(step * OPTIMIZER_STEPS_PER_STEP), rel=1e-9)
    assert lr[3] == pytest.approx(peak * (0.1 if on_resume == "use_checkpoint" else 0.325), rel=1e-9)
    # the new checkpoint records the schedule it followed, for the next resume to compare
    state = tmp_path / "results" / "it" / "checkpoints" / "step_4" / "runner_state.json"
    record = json.loads(state.read_text())["lr_schedule"]
    assert (record["decay_steps"], record["optimizer_steps"]) == (decay_steps, 8)
