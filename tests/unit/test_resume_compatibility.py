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
