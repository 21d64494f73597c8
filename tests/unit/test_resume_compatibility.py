"""A checkpoint resumes only into the run that wrote it: checked on the driver, before Ray starts."""

import pytest

from rlinf.config import load_config, save_resolved_config
from rlinf.runners.checkpointing import _check_compatible
from rlinf.utils.checkpoint import CheckpointError

MOONLIGHT = "moonlight-16b-grpo-megatron"  # TP=8, EP=8 on one 8-GPU node


@pytest.mark.parametrize(
    ("overrides", "this_run"),
    [
        (["actor.model.tensor_model_parallel_size=4"], "TP=4 PP=1 EP=8 ETP=1 CP=1 on 8 actor rank(s)"),
        (
            ["actor.model.expert_model_parallel_size=4", "actor.model.expert_tensor_parallel_size=2"],
            "TP=8 PP=1 EP=4 ETP=2 CP=1 on 8 actor rank(s)",
        ),
        (["cluster.num_nodes=2"], "TP=8 PP=1 EP=8 ETP=1 CP=1 on 16 actor rank(s)"),
    ],
    ids=["tp", "ep-etp", "world-size"],
)
def test_megatron_checkpoint_at_another_layout_is_refused_naming_both(tmp_path, overrides, this_run):
    saved = save_resolved_config(load_config(MOONLIGHT), tmp_path)
    with pytest.raises(CheckpointError) as err:
        _check_compatible(load_config(MOONLIGHT, overrides), saved)
    message = str(err.value)
    assert message.startswith(f"{saved}: incompatible checkpoint"), message
    assert "layout TP=8 PP=1 EP=8 ETP=1 CP=1 on 8 actor rank(s)" in message
    assert f"this run has {this_run}" in message


def test_same_layout_resumes_and_torch_workers_may_change(tmp_path):
    _check_compatible(load_config(MOONLIGHT), save_resolved_config(load_config(MOONLIGHT), tmp_path))
    # The torch actor's checkpoint is one full copy (rank 0 writes it): more DDP workers load it.
    tiny = save_resolved_config(load_config("tiny-moe-grpo-cpu"), tmp_path / "tiny")
    _check_compatible(load_config("tiny-moe-grpo-cpu", ["actor.num_workers=2"]), tiny)


def test_other_run_settings_are_refused_by_dotted_key(tmp_path):
    saved = save_resolved_config(load_config("tiny-moe-grpo-cpu"), tmp_path)
    with pytest.raises(
        CheckpointError, match="incompatible checkpoint: runner.seed was 1234, this run has 7"
    ):
        _check_compatible(load_config("tiny-moe-grpo-cpu", ["runner.seed=7"]), saved)


def _complete(root, step):
    path = root / f"step_{step}"
    path.mkdir(parents=True)
    (path / "COMPLETE").write_text("{}")
    return path


def _loader(cfg):
    from rlinf.data.prompt_loader import PromptLoader

    return PromptLoader(list(range(64)), cfg.data.rollout_batch_size, shuffle=False, seed=0)


def test_a_resume_past_the_last_step_is_refused_and_at_it_trains_nothing(tmp_path):
    from rlinf.config import ConfigError
    from rlinf.runners.checkpointing import ResumePoint, steps_left

    cfg = load_config("tiny-moe-grpo-cpu", ["runner.max_steps=3"])
    at = lambda step: ResumePoint(tmp_path / f"step_{step}", step, {})  # noqa: E731
    assert steps_left(cfg, at(1), _loader(cfg)) == 2
    assert steps_left(cfg, at(3), _loader(cfg)) == 0
    with pytest.raises(ConfigError) as err:
        steps_left(cfg, at(5), _loader(cfg))
    assert str(err.value) == (
        f"runner.max_steps=3, but the checkpoint to resume, {tmp_path / 'step_5'}, is already at step 5: "
        "this run would train nothing. Raise runner.max_steps above 5 to continue it"
    )
    by_epochs = load_config(
        "tiny-moe-grpo-cpu",
        ["runner.max_steps=-1", "runner.max_epochs=1", "actor.lr_sched.lr_decay_steps=200"],
    )
    with pytest.raises(ConfigError, match=r"^runner.max_epochs=1 \(4 steps\), but .* already at step 5"):
        steps_left(by_epochs, at(5), _loader(by_epochs))  # 64 prompts / 16 per step


def test_resume_auto_says_which_incomplete_step_it_skips(tmp_path, caplog):
    import logging

    from rlinf.runners.checkpointing import _resume_path, checkpoint_root

    cfg = load_config("tiny-moe-grpo-cpu", [f"runner.output_dir={tmp_path}", "runner.resume_dir=auto"])
    root = checkpoint_root(cfg)
    good = _complete(root, 2)
    (root / "step_1").mkdir()  # older than the one resumed: not worth a word
    (root / "step_3").mkdir()  # no COMPLETE marker
    with caplog.at_level(logging.WARNING, logger="rlinf.runners.checkpointing"):
        assert _resume_path(cfg) == good
    assert caplog.messages == [
        f"runner.resume_dir=auto: skipping {root / 'step_3'}: incomplete (no COMPLETE marker: its save did "
        f"not finish); resuming from {good}"
    ]


def test_a_failed_resume_names_the_checkpoint_before_the_one_that_failed(tmp_path):
    from rlinf.runners.checkpointing import ResumePoint, last_good_checkpoint
    from rlinf.scheduler.worker_group import WorkerDiedError, WorkerError

    first, second = _complete(tmp_path, 1), _complete(tmp_path, 2)
    point = ResumePoint(second, 2, {})
    bad_state = WorkerError("actor worker (rank 0) failed: CheckpointError: actor_state.pt: corrupt")
    bad_state.__cause__ = CheckpointError("actor_state.pt: corrupt")
    assert last_good_checkpoint(None, point, bad_state) == (
        f"{first} (the resume checkpoint {second} could not be loaded)"
    )
    # a failure that is not the checkpoint's: the checkpoint it resumed from is still good
    assert last_good_checkpoint(None, point, WorkerDiedError("rollout worker (rank 0) died")) == second
    only = ResumePoint(first, 1, {})
    assert last_good_checkpoint(None, only, bad_state).startswith("none (the resume checkpoint")
    assert last_good_checkpoint(None, None, bad_state) is None


def test_partial_rollout_must_match_and_a_checkpoint_from_before_the_key_means_off(tmp_path):
    import yaml

    partial = ["data.oversample_prompts=2", "data.partial_rollout=true"]
    saved = save_resolved_config(load_config("tiny-moe-grpo-cpu", partial), tmp_path / "on")
    with pytest.raises(CheckpointError, match="data.partial_rollout was True, this run has False"):
        _check_compatible(load_config("tiny-moe-grpo-cpu", ["data.oversample_prompts=2"]), saved)
    # a checkpoint written before data.partial_rollout existed holds no such key: it ran without it
    oversampled = load_config("tiny-moe-grpo-cpu", ["data.oversample_prompts=2"])
    older = save_resolved_config(oversampled, tmp_path / "older")
    resolved = yaml.safe_load(older.read_text())
    del resolved["data"]["partial_rollout"]
    older.write_text(yaml.safe_dump(resolved))
    _check_compatible(oversampled, older)
    with pytest.raises(CheckpointError, match="data.partial_rollout was False, this run has True"):
        _check_compatible(load_config("tiny-moe-grpo-cpu", partial), older)


def test_a_partial_rollout_checkpoint_without_its_carried_groups_is_refused(tmp_path):
    from rlinf.runners.checkpointing import CARRIED_GROUPS_FILE, _read_carried

    with pytest.raises(CheckpointError, match=f"{CARRIED_GROUPS_FILE}: unreadable carried groups"):
        _read_carried(tmp_path / CARRIED_GROUPS_FILE)
