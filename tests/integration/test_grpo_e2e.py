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

    # values, not just tags: read every step's row from the JSONL history
    rows = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in rows if r["step"] > 0}
    assert sorted(steps) == [1, 2, 3] and [r["step"] for r in rows if r["step"] > 0] == [1, 2, 3]
    data = next(r for r in rows if "data/train_prompts" in r)
    assert (data["data/train_prompts"], data["data/val_prompts"], data["data/train_filtered_prompts"]) == (
        64,
        8,
        0,
    )
    # where the start-up went, once, at step 0: Ray and each role's workers
    startup = ("time/startup_ray", "time/startup_actor", "time/startup_rollout", "time/startup_reward")
    assert data["step"] == 0 and all(data[key] > 0 for key in startup)
    assert [r["step"] for r in rows if "time/startup_actor" in r] == [0]
    for step, m in steps.items():
        assert m["rollout/num_responses"] == 4 * 4, step  # rollout_batch_size x group_size
        assert m["actor/skipped_steps"] == 0 and m["actor/early_stopped_minibatches"] == 0, step
        assert m["reward/timeouts"] == 0, step
        assert abs(m["advantages/mean"]) < 1e-6, step  # GRPO centres every group on its mean
        # rewards are +5 for right and -5 for wrong, so the mean reward follows from the accuracy
        assert m["rollout/reward_mean"] == pytest.approx(5.0 * (2 * m["rollout/accuracy"] - 1)), step
        assert 0 < m["rollout/response_length_mean"] <= m["rollout/response_length_max"] <= 24, step
        assert 0.0 <= m["rollout/truncated_fraction"] <= 1.0, step
        assert m["rollout/num_response_tokens"] == pytest.approx(16 * m["rollout/response_length_mean"]), step
        times = {k: v for k, v in m.items() if k.startswith("time/")}
        assert len(times) >= 6 and all(v > 0 for v in times.values()), times
        assert m["time/step"] >= sum(m[f"time/{p}"] for p in ("rollout", "reward", "logprobs", "train"))
        assert m["throughput/tokens_per_s"] > 0
        assert m["actor/lr"] > 0 and m["actor/grad_norm"] >= 0
        if m["advantages/zero_std_fraction"] < 1:  # some group has a signal: the policy gets a gradient
            assert m["actor/grad_norm"] > 0, step
    for step in (2, 3):  # validation rows: greedy accuracy and sampled mean@2 <= pass@2
        assert 0.0 <= steps[step]["val/accuracy"] <= 1.0
        assert steps[step]["val/mean@2"] <= steps[step]["val/pass@2"]

    assert (logs / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (logs / "resolved_config.yaml").is_file()
    checkpoint = tmp_path / "results" / "it" / "checkpoints" / "step_3"
    state = json.loads((checkpoint / "runner_state.json").read_text())
    assert state["step"] == 3 and state["data"]["index"] == 12
    model = AutoModelForCausalLM.from_pretrained(checkpoint / "actor" / "model")
    assert model.config.model_type == "deepseek_v3"


def test_rollout_holds_exactly_the_actor_weights_after_sync(random_tiny_checkpoint, tmp_path, ray_session):
    from dataclasses import replace

    import ray

    from rlinf.algorithms import compute_advantages
    from rlinf.models.hf_checkpoint import load_tokenizer
    from rlinf.runners.data_setup import build_datasets
    from rlinf.scheduler.roles import launch_roles
    from rlinf.weight_sync import sync_weights
    from rlinf.workers.rollout.sampling import SamplingParams

    cfg = small_config(random_tiny_checkpoint, tmp_path, **{"actor.optim.lr": 1e-2})
    train, _, _ = build_datasets(cfg, load_tokenizer(str(random_tiny_checkpoint)))
    roles = launch_roles(cfg)
    try:
        # an fp32 actor's processes start with exact fp32 GEMMs (rlinf.models.megatron.fp32_gemms)
        assert cfg.actor.model.precision == "fp32"
        override = [h.environment_variable.remote("NVIDIA_TF32_OVERRIDE") for h in roles.actor.handles]
        assert ray.get(override) == ["0"] * len(roles.actor.handles)
        assert ray.get(roles.rollout.handles[0].environment_variable.remote("NVIDIA_TF32_OVERRIDE")) is None
        params = SamplingParams.from_config(cfg.algorithm.sampling_params)
        batch = roles.rollout.call_rank0("generate", list(train)[:4], 4, params, 0)
        rewards = torch.arange(len(batch), dtype=torch.float32) % 3  # varied so advantages are non-zero
        adv = compute_advantages("grpo", rewards, batch.group_index).advantages
        batch = replace(batch, rewards=rewards, advantages=adv)
        batch = roles.actor.compute_logprobs(batch)
        roles.actor.train(batch, 1)
        actor_w = roles.actor.call_rank0("named_weights")
        before = roles.rollout.call_rank0("named_weights")
        assert any(not torch.equal(actor_w[k], before[k]) for k in actor_w), "training changed nothing"
        sync_weights(roles, bucket_mb=1)  # small buckets: several transfers
        after = roles.rollout.call_rank0("named_weights")
        assert actor_w.keys() == after.keys()
        assert all(torch.equal(actor_w[k], after[k]) for k in actor_w)
    finally:
        roles.shutdown()


def test_oversampled_prompts_train_on_exactly_the_batch(random_tiny_checkpoint, tmp_path, ray_session):
    # data.oversample_prompts: each step draws 4 + 2 prompts and trains on the first 4 groups to end
    cfg = small_config(
        random_tiny_checkpoint, tmp_path,
        **{"data.oversample_prompts": 2, "runner.max_steps": 2, "runner.val_check_interval": 0},
    )  # fmt: skip
    assert run(cfg) == 0
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["rollout/num_responses"] for r in steps] == [16, 16]  # rollout_batch_size x group_size
    assert all(abs(r["advantages/mean"]) < 1e-6 for r in steps)  # whole groups: each centred on its mean
    state = json.loads(
        (tmp_path / "results" / "it" / "checkpoints" / "step_2" / "runner_state.json").read_text()
    )
    assert state["data"]["index"] == 12  # 6 prompts drawn per step
