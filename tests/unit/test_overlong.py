"""reward.overlong_buffer: DAPO's soft overlong punishment at hand-computed points, applied by the
reward role to the grader's reward before advantages, with the raw reward kept and logged."""

from __future__ import annotations

import pytest
import torch
from test_reward_group import OneWorker

from rlinf.algorithms import compute_advantages
from rlinf.config.schema import AlgorithmConfig, Config, OverlongBufferConfig, RewardConfig, SamplingConfig
from rlinf.data.batch import RolloutBatch
from rlinf.rewards.overlong import overlong_penalties
from rlinf.runners.step_metrics import rollout_metrics
from rlinf.scheduler.facades import RewardGroup
from rlinf.workers.reward.reward_worker import RewardWorker


def test_penalty_matches_dapo_at_hand_computed_points():
    # L_max = 20, L_cache = 5, factor 2: free up to 15 tokens, then -2/5 per token, -2 from 20 on.
    lengths = [0, 10, 15, 16, 18, 20, 25]
    assert overlong_penalties(lengths, 20, 5, 2.0) == pytest.approx([0, 0, 0, -0.4, -1.2, -2.0, -2.0])


def test_penalty_at_the_paper_setting():
    # DAPO: L_max = 20480, L_cache = 4096, factor 1 (the paper's +-1 reward).
    got = overlong_penalties([16384, 16385, 18432, 20479, 20480], 20480, 4096, 1.0)
    assert got == pytest.approx([0.0, -1 / 4096, -0.5, -4095 / 4096, -1.0])


def test_a_buffer_as_long_as_the_limit_is_refused():
    with pytest.raises(ValueError, match="buffer_length must be in"):
        overlong_penalties([1], 8, 8, 1.0)


def _batch(lengths: list[int], texts: list[str]) -> RolloutBatch:
    rows, width = len(lengths), max(lengths)
    mask = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    return RolloutBatch(
        prompt_ids=torch.ones(rows, 2, dtype=torch.long),
        prompt_mask=torch.ones(rows, 2, dtype=torch.bool),
        response_ids=torch.full((rows, width), 3),
        response_mask=mask,
        group_index=torch.zeros(rows, dtype=torch.long),
        rollout_logprobs=torch.zeros(rows, width),
        finish_reasons=["stop"] * rows,
        response_text=texts,
        solutions=[("4",)] * rows,
    )


@pytest.mark.parametrize("enable", [True, False])
def test_the_reward_role_shapes_before_advantages_and_keeps_the_raw_reward(enable):
    cfg = Config(
        algorithm=AlgorithmConfig(sampling_params=SamplingConfig(max_new_tokens=10)),
        reward=RewardConfig(
            reward_scale=5.0,
            num_workers=1,
            overlong_buffer=OverlongBufferConfig(enable=enable, len=4, penalty_factor=2.0),
        ),
    )
    batch = _batch([3, 8, 10, 10], ["\\boxed{4}", "\\boxed{4}", "\\boxed{4}", "\\boxed{5}"])
    worker = RewardWorker(cfg)
    try:
        group = OneWorker(worker)
        scored = RewardGroup(group).score(batch)  # type: ignore[arg-type]
    finally:
        worker.close()
    assert group.sent == [(batch.response_text, batch.solutions, [3, 8, 10, 10])]
    raw = torch.tensor([5.0, 5.0, 5.0, -5.0])
    metrics = rollout_metrics(scored)
    if not enable:
        assert torch.equal(scored.rewards, raw) and scored.raw_rewards is None
        assert "rollout/raw_reward_mean" not in metrics
        return
    # 3 tokens: under 10 - 4; 8 tokens: 2 into the buffer, -2 x 2/4; at the limit: -2.
    assert scored.rewards.tolist() == pytest.approx([5.0, 4.0, 3.0, -7.0])
    assert torch.equal(scored.raw_rewards, raw)
    assert metrics["rollout/reward_mean"] == pytest.approx(5 / 4)
    assert metrics["rollout/raw_reward_mean"] == pytest.approx(10 / 4)
    assert metrics["rollout/overlong_penalty_mean"] == pytest.approx(-5 / 4)
    assert metrics["rollout/overlong_fraction"] == pytest.approx(3 / 4)
    # The advantages come from the shaped reward: three right answers no longer tie.
    advantages = compute_advantages("grpo", scored.rewards, scored.group_index).advantages
    assert advantages[0] > advantages[1] > advantages[2] > advantages[3]
