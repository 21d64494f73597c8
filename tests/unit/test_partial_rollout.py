"""data.partial_rollout bookkeeping (rlinf/workers/rollout/partial.py) over several steps of a
stand-in engine, and the torch rollout continuing a carried response exactly where it stopped."""

import json
import random
from types import SimpleNamespace

import pytest
import torch

from rlinf.data.datasets import PromptItem
from rlinf.models.tiny import SMALL_SETTINGS, random_deepseek_v3
from rlinf.workers.rollout.partial import (
    GroupInFlight,
    Piece,
    ResponseSoFar,
    continuations,
    finish_step,
    groups_from_json,
    groups_to_json,
    step_quota,
)
from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.torch_rollout import TorchRollout

MAX_NEW = 12


def item(prompt: int) -> PromptItem:
    return PromptItem((prompt, 1), f"p{prompt}", (str(prompt),), "test")


def token(prompt: int, response: int, position: int) -> int:
    """The token a response has at a position, whichever step generated it."""
    return prompt * 10_000 + response * 100 + position


def fake_generate(groups, keep, lengths):
    """One token per unfinished response per tick until the quota is met; response (prompt, r)
    ends with EOS after lengths[prompt, r] tokens, or at MAX_NEW."""
    requests = continuations(groups, MAX_NEW)
    for c in requests:
        assert c.generated + c.max_new_tokens == MAX_NEW  # the budget left
    quota = step_quota(groups, requests, keep)
    made: list[list[int]] = [[] for _ in requests]
    reasons = ["abort"] * len(requests)
    live = list(range(len(requests)))
    while live and not quota.met:
        finished = []
        for i in live:
            c = requests[i]
            prompt = groups[c.group].item.prompt_ids[0]
            position = c.generated + len(made[i])
            made[i].append(token(prompt, c.response, position))
            if position + 1 == lengths[prompt, c.response]:
                reasons[i] = "stop"
            elif len(made[i]) == c.max_new_tokens:
                reasons[i] = "length"
            else:
                continue
            finished.append(i)
        quota.finish(finished)
        live = [i for i in live if i not in finished]
    pieces = [Piece(ids, [-t / 1e6 for t in ids], reason) for ids, reason in zip(made, reasons, strict=True)]
    return finish_step(groups, requests, pieces, quota, pad_id=0, decode=lambda ids: str(len(ids)))


@pytest.mark.parametrize("seed", range(5))
def test_carried_groups_are_trained_once_whole_and_within_the_budget(seed):
    rng = random.Random(seed)
    keep, extra, n, steps = 3, 2, 2, 12
    lengths = {(p, r): rng.randint(1, 2 * MAX_NEW) for p in range(100) for r in range(n)}
    next_prompt, carried, trained = 0, [], []
    for _ in range(steps):
        fresh = [GroupInFlight.fresh(item(next_prompt + i), n) for i in range(keep + extra - len(carried))]
        next_prompt += len(fresh)
        groups = carried + fresh
        result = fake_generate(groups, keep, lengths)
        batch = result.batch
        assert batch.group_index.tolist() == [g for g in range(keep) for _ in range(n)]
        assert len(result.carried) == extra  # every group in flight is kept or carried, once
        assert result.carried_tokens == sum(g.num_tokens for g in groups if g.item.prompt_ids[0] in {
            int(s[0]) for s in batch.solutions
        })  # fmt: skip
        assert all(not g.complete or g in result.carried for g in result.carried)
        lengths_now = batch.response_mask.sum(1).tolist()
        for row, (prompt, width) in enumerate(zip(batch.solutions, lengths_now, strict=True)):
            p, r = int(prompt[0]), row % n
            assert width == min(lengths[p, r], MAX_NEW) <= MAX_NEW  # nothing lost, nothing beyond the budget
            assert batch.response_ids[row, :width].tolist() == [token(p, r, i) for i in range(width)]
            assert batch.finish_reasons[row] == ("stop" if lengths[p, r] <= MAX_NEW else "length")
            assert torch.equal(batch.rollout_logprobs[row, :width], -batch.response_ids[row, :width] / 1e6)
        trained += [int(s[0]) for s in batch.solutions[::n]]
        carried = result.carried
    assert len(trained) == len(set(trained)) == keep * steps  # no group trained twice
    in_flight = {g.item.prompt_ids[0] for g in carried}
    assert set(trained) | in_flight == set(range(next_prompt)) and not set(trained) & in_flight
    assert result.max_carry_steps >= 1


def test_a_carried_group_that_completes_is_kept_first():
    done = ResponseSoFar((5, 6), (-0.1, -0.2), "stop")
    complete = GroupInFlight(item(7), (done, done), steps=1)  # completed past the quota last step
    running = GroupInFlight(item(8), (done, ResponseSoFar((3,), (-0.3,))), steps=1)
    fresh = GroupInFlight.fresh(item(9), 2)
    lengths = {(8, 1): 3, (9, 0): 2, (9, 1): 2}
    result = fake_generate([running, fresh, complete], 1, lengths)
    assert [s[0] for s in result.batch.solutions] == ["7", "7"]
    assert result.carried_tokens == 4 and result.max_carry_steps == 2
    assert [g.item.prompt_ids[0] for g in result.carried] == [8, 9]
    assert [g.steps for g in result.carried] == [2, 1]


def test_a_response_never_exceeds_max_new_tokens():
    so_far = ResponseSoFar((1,) * 10, (0.0,) * 10)
    assert so_far.extended(Piece([2, 2], [0.0, 0.0], "abort"), MAX_NEW).finish_reason == "length"
    with pytest.raises(ValueError, match="exceeds max_new_tokens"):
        so_far.extended(Piece([2, 2, 2], [0.0] * 3, "length"), MAX_NEW)


def test_carried_groups_survive_json_exactly():
    group = GroupInFlight(
        item(3), (ResponseSoFar((4, 5), (-0.1 / 3, -1e-9), "stop"), ResponseSoFar()), steps=2
    )
    assert groups_from_json(json.loads(json.dumps(groups_to_json([group])))) == [group]


def tiny_rollout(max_batch_size: int = 8) -> TorchRollout:
    torch.manual_seed(0)
    rollout = object.__new__(TorchRollout)
    rollout.model = random_deepseek_v3(SMALL_SETTINGS, vocab_size=64, eos_token_id=1).float().eval()
    rollout.device = torch.device("cpu")
    rollout.eos_ids, rollout.pad_id = [63], 0  # greedy never picks 63 here: responses run to the limit
    rollout.tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: " ".join(map(str, ids)))
    rollout.cfg = SimpleNamespace(rollout=SimpleNamespace(max_batch_size=max_batch_size))
    return rollout


def test_a_greedy_response_continued_next_step_equals_the_one_made_in_one_go():
    rollout = tiny_rollout()
    params = SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW)
    prompt = PromptItem((5, 9, 17, 33), "p", ("x",), "test")
    whole = rollout.generate_partial([GroupInFlight.fresh(prompt, 1)], params, seed=1, keep_groups=1).batch
    assert whole.response_mask.sum() > 4  # long enough to be cut at the third token

    # A carried group with 3 tokens of budget left ends by length at the third decode step: the
    # quota (keep 1) is met there and the fresh prompt's response stops after 3 tokens.
    nearly = ResponseSoFar((7,) * (MAX_NEW - 3), (-1.0,) * (MAX_NEW - 3))
    step1 = rollout.generate_partial(
        [GroupInFlight.fresh(prompt, 1), GroupInFlight(item(2), (nearly,), steps=1)],
        params,
        seed=1,
        keep_groups=1,
    )
    (carried,) = step1.carried
    assert [len(r.token_ids) for r in carried.responses] == [3] and not carried.complete
    step2 = rollout.generate_partial([carried], params, seed=2, keep_groups=1)
    assert step2.carried_tokens == 3 and step2.max_carry_steps == 2 and not step2.carried
    piece = step2.batch
    assert piece.finish_reasons == whole.finish_reasons
    assert torch.equal(piece.response_ids, whole.response_ids)
    assert torch.equal(piece.response_mask, whole.response_mask)
    torch.testing.assert_close(piece.rollout_logprobs, whole.rollout_logprobs, rtol=0, atol=1e-5)
    assert piece.response_text == whole.response_text


@pytest.mark.parametrize("partial", [True, False])
def test_an_epoch_counts_steps_in_the_prompts_each_step_draws(partial):
    """With partial_rollout a step draws rollout_batch_size fresh prompts once the first has filled
    the flight, so an epoch trains as many groups as the dataset holds; without it a step draws
    rollout_batch_size + oversample_prompts."""
    from rlinf.data.prompt_loader import training_loader
    from rlinf.runners.checkpointing import planned_steps

    data = SimpleNamespace(rollout_batch_size=4, oversample_prompts=2, partial_rollout=partial, shuffle=False)
    cfg = SimpleNamespace(data=data, runner=SimpleNamespace(seed=0, max_epochs=2, max_steps=-1))
    loader = training_loader(list(range(20)), cfg)
    assert loader.steps_per_epoch == (5 if partial else 3)
    assert planned_steps(cfg, loader) == (10 if partial else 6)
    first = loader.next_batch(6)  # a partial run's first step: the whole flight
    assert first == list(range(6)) and len(loader.next_batch()) == (4 if partial else 6)
