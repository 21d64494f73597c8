"""The LR schedule across a resume (rlinf/runners/lr_resume.py): the resolved schedule a checkpoint
records, the comparison with a resumed run's, and the config each actor.lr_sched.on_resume choice
trains with."""

import json
import logging
from pathlib import Path

import pytest

from rlinf.algorithms.lr_schedule import ResolvedLRSchedule, lr_multiplier_from_config, resolved_lr_schedule
from rlinf.config import ConfigError, load_config
from rlinf.runners.lr_resume import (
    RECORD_KEY,
    config_on_resume,
    lr_schedule_record,
    read_lr_schedule_record,
    schedule_differences,
)
from rlinf.utils.checkpoint import CheckpointError

CHECKPOINT = Path("/out/checkpoints/step_2")
# The tiny recipe: cosine to 0.1 x lr over runner.max_steps x 2 optimizer steps, after 2 warmup steps.
TINY = "tiny-moe-grpo-cpu"


def tiny(*overrides: str):
    return load_config(TINY, list(overrides))


def recorded(cfg, optimizer_steps: int = 4):
    """What a checkpoint of `cfg` records, as read back from its runner_state.json."""
    state = json.loads(json.dumps({RECORD_KEY: lr_schedule_record(cfg, optimizer_steps)}))
    return read_lr_schedule_record(state, CHECKPOINT / "runner_state.json")


def test_every_style_resolves_only_the_values_it_uses():
    lr = tiny().actor.optim.lr
    assert resolved_lr_schedule(tiny("runner.max_steps=2")) == ResolvedLRSchedule(
        "cosine", lr, 2, 4, lr * 0.1
    )
    warmup = tiny("actor.lr_sched.lr_decay_style=warmup_constant")
    assert resolved_lr_schedule(warmup) == ResolvedLRSchedule("warmup_constant", lr, 2, None, None)
    constant = tiny("actor.lr_sched.lr_decay_style=constant")
    assert resolved_lr_schedule(constant) == ResolvedLRSchedule("constant", lr, None, None, None)


@pytest.mark.parametrize(
    ("style", "differs"),
    [("cosine", True), ("warmup_constant", False), ("constant", False)],
)
def test_extending_a_run_changes_only_a_decay_derived_from_max_steps(style, differs):
    first = tiny("runner.max_steps=2", f"actor.lr_sched.lr_decay_style={style}")
    longer = tiny("runner.max_steps=4", f"actor.lr_sched.lr_decay_style={style}")
    found = schedule_differences(resolved_lr_schedule(first), resolved_lr_schedule(longer))
    assert found == (
        [
            "decay_steps: 4 in the checkpoint, 8 in this run (actor.lr_sched.lr_decay_steps; null: "
            "runner.max_steps x optimizer steps per step)"
        ]
        if differs
        else []
    )
    pinned = [f"actor.lr_sched.lr_decay_style={style}", "actor.lr_sched.lr_decay_steps=40"]
    assert not schedule_differences(
        resolved_lr_schedule(tiny("runner.max_steps=2", *pinned)),
        resolved_lr_schedule(tiny("runner.max_steps=4", *pinned)),
    )


def test_the_record_round_trips_and_a_spoiled_one_names_the_file():
    cfg = tiny("runner.max_steps=2")
    assert recorded(cfg, 4) == (resolved_lr_schedule(cfg), 4)
    assert read_lr_schedule_record({"step": 2}, CHECKPOINT) is None  # written before records existed
    spoiled = {RECORD_KEY: {**lr_schedule_record(cfg, 4), "style": "linear"}}
    with pytest.raises(
        CheckpointError, match=r"^/out/checkpoints/step_2: unreadable lr_schedule: .*'linear'"
    ):
        read_lr_schedule_record(spoiled, CHECKPOINT)


def test_a_different_schedule_stops_with_one_line_naming_both_values_and_the_ways_on():
    with pytest.raises(ConfigError) as err:
        config_on_resume(tiny("runner.max_steps=4"), recorded(tiny("runner.max_steps=2")), CHECKPOINT)
    assert str(err.value) == (
        "runner.resume_dir: this run's LR schedule differs from the one /out/checkpoints/step_2 recorded: "
        "decay_steps: 4 in the checkpoint, 8 in this run (actor.lr_sched.lr_decay_steps; null: runner.max_steps "
        "x optimizer steps per step). Set actor.lr_sched.on_resume=use_checkpoint to keep the checkpoint's "
        "schedule, or actor.lr_sched.on_resume=override to follow this run's from optimizer step 4 on"
    )
    with pytest.raises(
        ConfigError, match=r"peak_lr: 1e-05 in the checkpoint, 0.002 in this run \(actor.optim.lr\)"
    ):
        config_on_resume(tiny("actor.optim.lr=0.002"), recorded(tiny("actor.optim.lr=0.00001")), CHECKPOINT)


FIRST_RUNS = [
    ["runner.max_steps=2"],
    ["runner.max_steps=2", "actor.optim.lr=0.003", "actor.lr_sched.min_lr_ratio=0.3"],
    ["actor.lr_sched.lr_decay_style=warmup_constant", "actor.lr_sched.lr_warmup_steps=5"],
    ["actor.lr_sched.lr_decay_style=constant", "actor.optim.lr=0.004"],
]
NEW_RUNS = [
    ["runner.max_steps=4"],
    ["runner.max_steps=4", "actor.lr_sched.lr_decay_style=warmup_constant", "actor.optim.lr=0.001"],
    ["actor.lr_sched.lr_decay_style=constant"],
]


@pytest.mark.parametrize("first", FIRST_RUNS, ids=lambda o: " ".join(o))
@pytest.mark.parametrize("new", NEW_RUNS, ids=lambda o: " ".join(o))
def test_use_checkpoint_trains_with_the_recorded_schedule_and_override_with_its_own(first, new, caplog):
    first_cfg = tiny(*first)
    record = recorded(first_cfg)
    keep = config_on_resume(tiny(*new, "actor.lr_sched.on_resume=use_checkpoint"), record, CHECKPOINT)
    assert not schedule_differences(resolved_lr_schedule(first_cfg), resolved_lr_schedule(keep))
    first_lr, kept_lr = lr_multiplier_from_config(first_cfg), lr_multiplier_from_config(keep)
    for k in range(40):  # what each actor computes: optim.lr x the multiplier at optimizer step k
        assert keep.actor.optim.lr * kept_lr(k) == pytest.approx(
            first_cfg.actor.optim.lr * first_lr(k), rel=1e-12
        )
    new_cfg = tiny(*new, "actor.lr_sched.on_resume=override")
    with caplog.at_level(logging.INFO, logger="rlinf.runners.lr_resume"):
        assert config_on_resume(new_cfg, record, CHECKPOINT) is new_cfg
    assert len(caplog.messages) == 1
    assert caplog.messages[0].startswith(
        "actor.lr_sched.on_resume=override: following this run's LR schedule"
    )


def test_each_start_up_says_in_one_line_which_schedule_it_follows(caplog):
    record = recorded(tiny("runner.max_steps=2"), 4)
    with caplog.at_level(logging.INFO, logger="rlinf.runners.lr_resume"):
        same = tiny("runner.max_steps=2")
        assert config_on_resume(same, record, CHECKPOINT) is same
        config_on_resume(
            tiny("runner.max_steps=4", "actor.lr_sched.on_resume=use_checkpoint"), record, CHECKPOINT
        )
        old = tiny("runner.max_steps=4")
        assert config_on_resume(old, None, CHECKPOINT) is old  # a checkpoint from before: as before
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO", "WARNING"]
    assert caplog.messages[0].startswith("LR schedule: the checkpoint's, continued from optimizer step 4")
    assert caplog.messages[1].startswith(
        "actor.lr_sched.on_resume=use_checkpoint: keeping the checkpoint's LR schedule from optimizer step 4"
    )
    assert caplog.messages[2] == (
        "/out/checkpoints/step_2 does not record its LR schedule (it was written before checkpoints did): "
        "this run follows its own config's schedule from the restored optimizer step, unchecked"
    )
    assert all("\n" not in m for m in caplog.messages)
