"""GRPO steps through real Ray workers on the CPU, end to end."""

import json

import pytest
import torch

from rlinf.runners.main import run
from tests.integration.conftest import small_config

pytestmark = pytest.mark.slow

DOCUMENTED_STEP_METRICS = [
    "rollout/reward_mean",
    "rollout/accuracy",
    "rollout/response_length_mean",
    "rollout/response_length_max",
    "rollout/truncated_fraction",
    "rollout/logprob_abs_diff",
    "rollout/logprob_abs_diff_max",
    "reward/timeouts",
    "advantages/mean",
    "advantages/zero_std_fraction",
    "actor/policy_loss",
    "actor/ratio_mean",
    "actor/clip_fraction_low",
    "actor/clip_fraction_high",
    "actor/approx_kl",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "actor/early_stopped_minibatches",
    "actor/skipped_steps",
    "time/rollout",
    "time/reward",
    "time/logprobs",
    "time/train",
    "time/weight_sync",
    "time/step",
    "throughput/tokens_per_s",
]


def test_three_grpo_steps_write_metrics_plot_and_checkpoint(random_tiny_checkpoint, tmp_path, ray_session):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM

    cfg = small_config(random_tiny_checkpoint, tmp_path, **{"algorithm.val_n": 2})
    assert run(cfg) == 0

    logs = tmp_path / "logs"
    events = EventAccumulator(str(logs))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    missing = [m for m in DOCUMENTED_STEP_METRICS if m not in tags]
    assert not missing, f"metrics missing from TensorBoard: {missing}"
    assert [e.step for e in events.Scalars("rollout/reward_mean")] == [1, 2, 3]
    # validation before the first step, at the interval and at the end
    assert [e.step for e in events.Scalars("val/accuracy")] == [0, 2, 3]
    assert {"val/mean@2", "val/pass@2"} <= tags
    # fp32 on CPU: rollout and actor logprobs agree to rounding
    assert max(e.value for e in events.Scalars("rollout/logprob_abs_diff")) <= 1e-4

    assert (logs / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (logs / "resolved_config.yaml").is_file()
    checkpoint = tmp_path / "results" / "it" / "checkpoints" / "step_3"
    state = json.loads((checkpoint / "runner_state.json").read_text())
    assert state["step"] == 3 and state["data"]["index"] == 12
    model = AutoModelForCausalLM.from_pretrained(checkpoint / "actor" / "model")
    assert model.config.model_type == "deepseek_v3"


def test_rollout_holds_exactly_the_actor_weights_after_sync(random_tiny_checkpoint, tmp_path, ray_session):
    from dataclasses import replace

    from rlinf.algorithms import compute_advantages
    from rlinf.models.loader import load_tokenizer
    from rlinf.runners.data_setup import build_datasets
    from rlinf.scheduler.roles import launch_roles
    from rlinf.weight_sync import sync_weights
    from rlinf.workers.rollout.sampling import SamplingParams

    cfg = small_config(random_tiny_checkpoint, tmp_path, **{"actor.optim.lr": 1e-2})
    train, _, _ = build_datasets(cfg, load_tokenizer(str(random_tiny_checkpoint)))
    roles = launch_roles(cfg)
    try:
        params = SamplingParams.from_config(cfg.algorithm.sampling_params)
        batch = roles.rollout.call_rank0("generate", list(train)[:4], 4, params, 0)
        rewards = torch.arange(len(batch), dtype=torch.float32) % 3  # varied so advantages are non-zero
        adv = compute_advantages("grpo", rewards, batch.group_index).advantages
        batch = replace(batch, rewards=rewards, advantages=adv)
        batch = roles.actor.call_rank0("compute_logprobs", batch)
        roles.actor.call_rank0("train", batch, 1)
        actor_w = roles.actor.call_rank0("named_weights")
        before = roles.rollout.call_rank0("named_weights")
        assert any(not torch.equal(actor_w[k], before[k]) for k in actor_w), "training changed nothing"
        sync_weights(roles, bucket_mb=1)  # small buckets: several transfers
        after = roles.rollout.call_rank0("named_weights")
        assert actor_w.keys() == after.keys()
        assert all(torch.equal(actor_w[k], after[k]) for k in actor_w)
    finally:
        roles.shutdown()
