"""Non-finite losses skip the optimizer step, are counted, and abort after the configured limit."""

from dataclasses import replace

import pytest
import torch

from rlinf.algorithms import compute_advantages
from rlinf.models.hf_checkpoint import load_tokenizer
from rlinf.runners.data_setup import build_datasets
from rlinf.workers.actor.base import with_logprobs
from rlinf.workers.actor.torch_actor import TorchActor, TrainingDivergedError
from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.torch_rollout import TorchRollout
from tests.integration.conftest import small_config


@pytest.fixture
def actor_and_batch(random_tiny_checkpoint, tmp_path):
    cfg = small_config(random_tiny_checkpoint, tmp_path, **{"runner.max_consecutive_skips": 2})
    train, _, _ = build_datasets(cfg, load_tokenizer(str(random_tiny_checkpoint)))
    rollout = TorchRollout(cfg)
    batch = rollout.generate(
        list(train)[:4], 4, SamplingParams.from_config(cfg.algorithm.sampling_params), seed=0
    )
    rewards = torch.arange(len(batch), dtype=torch.float32) % 2
    batch = replace(
        batch, rewards=rewards, advantages=compute_advantages("grpo", rewards, batch.group_index).advantages
    )
    actor = TorchActor(cfg)
    return actor, with_logprobs(batch, [actor.compute_logprobs(batch)])


def test_nan_loss_skips_the_step_then_aborts(actor_and_batch):
    actor, batch = actor_and_batch
    poisoned = replace(batch, advantages=torch.full_like(batch.advantages, float("nan")))
    before = actor.named_weights()
    metrics = actor.train(poisoned, step=1)  # 16 responses / global batch 8 = 2 minibatches, both skipped
    assert metrics["actor/skipped_steps"] == 2.0
    after = actor.named_weights()
    assert all(torch.equal(before[k], after[k]) for k in before), "a skipped step must not touch the weights"
    assert all(p.grad is None for p in actor.model.parameters())
    with pytest.raises(
        TrainingDivergedError, match=r"3 consecutive optimizer steps .*runner\.max_consecutive_skips=2"
    ):
        actor.train(poisoned, step=2)


def test_a_finite_step_resets_the_consecutive_count(actor_and_batch):
    actor, batch = actor_and_batch
    poisoned = replace(batch, advantages=torch.full_like(batch.advantages, float("nan")))
    actor.train(poisoned, step=1)
    healthy = actor.train(batch, step=2)
    assert healthy["actor/skipped_steps"] == 0.0 and actor.consecutive_skips == 0
    assert actor.train(poisoned, step=3)["actor/skipped_steps"] == 2.0  # counted again from zero: no abort
