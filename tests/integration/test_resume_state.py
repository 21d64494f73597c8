"""An actor checkpoint round-trips everything a resumed run depends on: weights, optimizer moments,
LR-schedule position, skip counters and the torch RNG; the next update then equals the original's.
A restored actor follows the LR schedule its own config holds from the restored position."""

from dataclasses import replace

import pytest
import torch

from rlinf.algorithms import compute_advantages
from rlinf.workers.actor.base import with_logprobs
from tests.integration.conftest import small_config


def _tensors_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _scored_batch(cfg, checkpoint):
    """4 prompts x 4 responses of the tiny model, with rewards that give non-zero advantages."""
    from rlinf.models.hf_checkpoint import load_tokenizer
    from rlinf.runners.data_setup import build_datasets
    from rlinf.workers.rollout.sampling import SamplingParams
    from rlinf.workers.rollout.torch_rollout import TorchRollout

    train, _, _ = build_datasets(cfg, load_tokenizer(str(checkpoint)))
    rollout = TorchRollout(cfg)
    batch = rollout.generate(list(train)[:4], 4, SamplingParams.from_config(cfg.algorithm.sampling_params), 0)
    rewards = torch.arange(len(batch), dtype=torch.float32) % 3
    return replace(
        batch, rewards=rewards, advantages=compute_advantages("grpo", rewards, batch.group_index).advantages
    )


def test_actor_state_round_trips_and_the_next_update_is_identical(random_tiny_checkpoint, tmp_path):
    from rlinf.workers.actor.torch_actor import TorchActor

    # The tiny recipe warms up over 2 steps, then decays: the LR of the next step depends on the schedule.
    cfg = small_config(random_tiny_checkpoint, tmp_path, **{"actor.optim.lr": 1e-2})
    batch = _scored_batch(cfg, random_tiny_checkpoint)

    original = TorchActor(cfg)
    original.train(batch, 1, original.compute_logprobs(batch))
    torch.manual_seed(4321)  # an RNG state that differs from the one a fresh actor starts with
    original.save(str(tmp_path / "ckpt"))
    saved_rng = torch.get_rng_state()

    restored = TorchActor(cfg)  # re-seeds the global RNG with runner.seed
    assert not torch.equal(torch.get_rng_state(), saved_rng)
    restored.load(str(tmp_path / "ckpt"))
    assert torch.equal(torch.get_rng_state(), saved_rng)
    assert _tensors_equal(restored.optimizer.state_dict(), original.optimizer.state_dict())
    assert restored.scheduler.state_dict() == original.scheduler.state_dict()
    assert restored.scheduler.get_last_lr() == original.scheduler.get_last_lr() != [1e-2 / 2]
    assert (restored.skips.consecutive, restored.skips.total) == (
        original.skips.consecutive,
        original.skips.total,
    )
    assert _tensors_equal(restored.named_weights(), original.named_weights())

    second = with_logprobs(batch, [original.compute_logprobs(batch)])
    metrics_a = original.train(second, 2)
    metrics_b = restored.train(batch, 2, restored.compute_logprobs(batch))
    assert metrics_a == metrics_b
    assert _tensors_equal(original.named_weights(), restored.named_weights())


def test_a_restored_actor_follows_the_lr_schedule_of_its_config(random_tiny_checkpoint, tmp_path):
    """use_checkpoint hands the actor a config holding the recorded schedule, override the new run's
    own (rlinf.runners.lr_resume): either way the restored actor follows its config's peak and shape
    from the restored optimizer step, not what the saved optimizer and scheduler states carry."""
    from rlinf.algorithms.lr_schedule import lr_multiplier_from_config, resolved_lr_schedule
    from rlinf.runners.lr_resume import with_lr_schedule
    from rlinf.workers.actor.torch_actor import TorchActor

    # 2 optimizer steps per GRPO step (16 responses, 8 per minibatch); the cosine decays over the run.
    first = small_config(random_tiny_checkpoint, tmp_path, **{"actor.optim.lr": 1e-2, "runner.max_steps": 2})
    batch = _scored_batch(first, random_tiny_checkpoint)
    original = TorchActor(first)
    original.train(batch, 1, original.compute_logprobs(batch))
    assert original.save(str(tmp_path / "ckpt")) == 2  # the optimizer steps the checkpoint records

    longer = small_config(random_tiny_checkpoint, tmp_path, **{"actor.optim.lr": 2e-2, "runner.max_steps": 4})
    kept = with_lr_schedule(longer, resolved_lr_schedule(first))
    for cfg in (longer, kept):
        restored = TorchActor(cfg)
        restored.load(str(tmp_path / "ckpt"))
        at = lr_multiplier_from_config(cfg)
        assert restored.current_lr() == cfg.actor.optim.lr * at(2)  # the rate of the next optimizer step
        metrics = restored.train(batch, 2, restored.compute_logprobs(batch))
        assert metrics["actor/lr"] == cfg.actor.optim.lr * at(4)
    assert kept.actor.optim.lr * lr_multiplier_from_config(kept)(4) == pytest.approx(1e-3)  # first's floor
    assert longer.actor.optim.lr * lr_multiplier_from_config(longer)(4) > 1e-2  # halfway down from 2e-2
