"""A token budget per micro-batch regroups the rows, not the maths, and so does packing each
micro-batch's sequences into one row without padding: the torch actor (fp32, tiny model)
recomputes the same logprobs in the batch's row order and takes the same optimizer step as with
micro-batches of a fixed number of rows."""

import json

import pytest
import torch

from rlinf.workers.actor.base import with_logprobs
from rlinf.workers.actor.policy_update import micro_batch_rows
from rlinf.workers.actor.torch_actor import TorchActor
from tests.integration.conftest import small_config
from tests.integration.test_many_ranks_actor import OVERRIDES
from tests.unit.test_micro_batches import batch_with_lengths

# 16 rows (2 minibatches of 8): responses from 1 to 24 tokens, prompts of 5 to 12
PROMPTS = [9, 5, 12, 7, 10, 6, 8, 11, 5, 9, 12, 6, 7, 10, 8, 11]
RESPONSES = [24, 1, 3, 22, 2, 1, 18, 4, 24, 2, 1, 9, 23, 1, 5, 12]
# the smallest budget validation allows here: data.max_prompt_length 64 + max_new_tokens 24
BUDGET = 88


@pytest.mark.parametrize("pack", [False, True])
def test_token_budget_gives_the_logprobs_and_the_step_of_fixed_micro_batches(
    random_tiny_checkpoint, tmp_path, pack
):
    vocab = json.loads((random_tiny_checkpoint / "config.json").read_text())["vocab_size"]
    batch = batch_with_lengths(PROMPTS, RESPONSES, vocab=vocab, seed=5)
    fixed = TorchActor(small_config(random_tiny_checkpoint, tmp_path, **OVERRIDES))
    budget = {"actor.max_tokens_per_micro_batch": BUDGET, "actor.pack_sequences": str(pack).lower()}
    packed = TorchActor(small_config(random_tiny_checkpoint, tmp_path, **{**OVERRIDES, **budget}))
    assert packed.settings.pack_sequences is pack
    plan = micro_batch_rows(packed, batch, packed.settings)
    assert sorted(len(rows) for rows in plan) != [2] * 8, "the budget must group rows differently"
    assert any(rows != sorted(rows) or len(rows) > 2 for rows in plan)

    old = with_logprobs(batch, [fixed.compute_logprobs(batch)])
    regrouped = with_logprobs(batch, [packed.compute_logprobs(batch)])
    assert torch.allclose(regrouped.old_logprobs, old.old_logprobs, rtol=0, atol=1e-6)
    assert bool((old.old_logprobs[old.response_mask] != 0).all()), "every response token has a logprob"

    before = fixed.named_weights()
    fixed_metrics = fixed.train(old, step=1)
    packed_metrics = packed.train(old, step=1)
    fixed_weights, packed_weights = fixed.named_weights(), packed.named_weights()
    moved = max(float((fixed_weights[k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-4, "the step must move the weights well beyond the tolerance below"
    for name, weight in fixed_weights.items():
        assert torch.allclose(packed_weights[name], weight, rtol=1e-6, atol=1e-7), name
    for name in ("actor/loss", "actor/grad_norm", "actor/ratio_mean", "actor/entropy"):
        assert abs(packed_metrics[name] - fixed_metrics[name]) <= 1e-6 * max(1.0, abs(fixed_metrics[name])), (
            name
        )


@pytest.mark.parametrize(
    ("sizes", "forwards"),
    [
        ({"actor.logprob_micro_batch_size": 8}, 2),
        (
            {
                "actor.max_tokens_per_micro_batch": BUDGET,
                "actor.logprob_max_tokens_per_micro_batch": 4 * BUDGET,
            },
            None,
        ),
    ],
    ids=["rows", "tokens"],
)
def test_the_logprob_pass_takes_its_own_micro_batch_size(random_tiny_checkpoint, tmp_path, sizes, forwards):
    """The logprob pass forms fewer, larger micro-batches than training and recomputes the same
    logprobs; training keeps its own."""
    vocab = json.loads((random_tiny_checkpoint / "config.json").read_text())["vocab_size"]
    batch = batch_with_lengths(PROMPTS, RESPONSES, vocab=vocab, seed=5)
    training_sized = {k: v for k, v in sizes.items() if "logprob" not in k}
    base = TorchActor(small_config(random_tiny_checkpoint, tmp_path, **{**OVERRIDES, **training_sized}))
    actor = TorchActor(small_config(random_tiny_checkpoint, tmp_path, **{**OVERRIDES, **sizes}))
    train_plan = micro_batch_rows(actor, batch, actor.settings)
    logprob_plan = micro_batch_rows(actor, batch, actor.settings.for_logprobs())
    assert train_plan == micro_batch_rows(base, batch, base.settings)
    assert len(logprob_plan) < len(train_plan)
    if forwards is not None:
        assert len(logprob_plan) == forwards

    calls = []
    forward = actor._logprobs  # one micro-batch's forward
    actor._logprobs = lambda *a, **kw: calls.append(1) or forward(*a, **kw)
    try:
        larger = with_logprobs(batch, [actor.compute_logprobs(batch)])
    finally:
        del actor._logprobs
    assert len(calls) == len(logprob_plan)
    old = with_logprobs(batch, [base.compute_logprobs(batch)])
    assert torch.allclose(larger.old_logprobs, old.old_logprobs, rtol=0, atol=1e-6)
