"""Micro-batches by token budget: known plans, the invariants of every plan, the same count on every
DP rank, and the plan `run_policy_update` uses (rlinf/workers/actor/micro_batches.py)."""

import itertools
import random

import pytest
import torch

from rlinf.config import load_config
from rlinf.config.schema import AlgorithmConfig
from rlinf.data.batch import RolloutBatch
from rlinf.workers.actor.micro_batches import (
    RowLength,
    min_micro_batches,
    packed_tokens,
    padded_tokens,
    plan_micro_batches,
)
from rlinf.workers.actor.policy_update import UpdateSettings, micro_batch_rows

# (prompt, response): longest first with ties by index is rows 0, 2, 4, 5, 1, 3
LENGTHS = [
    RowLength(4, 20),
    RowLength(4, 2),
    RowLength(5, 19),
    RowLength(3, 1),
    RowLength(4, 10),
    RowLength(4, 3),
]


def batch_with_lengths(prompt_lens, response_lens, vocab: int = 64, seed: int = 0) -> RolloutBatch:
    """Left-padded prompts and right-padded responses of exactly these lengths, GRPO-ready fields."""
    g = torch.Generator().manual_seed(seed)
    rows, width_p, width_r = len(prompt_lens), max(prompt_lens), max(response_lens)
    prompt_mask = torch.arange(width_p)[None] >= (width_p - torch.tensor(prompt_lens))[:, None]
    response_mask = torch.arange(width_r)[None] < torch.tensor(response_lens)[:, None]
    prompt_ids = torch.randint(3, vocab, (rows, width_p), generator=g).masked_fill(~prompt_mask, 0)
    response_ids = torch.randint(3, vocab, (rows, width_r), generator=g).masked_fill(~response_mask, 0)
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        group_index=torch.arange(rows) // 4,
        rollout_logprobs=-torch.rand(rows, width_r, generator=g) * response_mask,
        finish_reasons=["stop"] * rows,
        response_text=[""] * rows,
        solutions=[("0",)] * rows,
        rewards=torch.arange(rows, dtype=torch.float32) % 3,
        advantages=torch.randn(rows, generator=g),
    )


def test_padded_tokens_is_the_trimmed_shape():
    batch = batch_with_lengths([4, 4, 5], [20, 2, 19])
    lengths = [RowLength(4, 20), RowLength(4, 2), RowLength(5, 19)]
    assert padded_tokens(lengths) == batch.trimmed().input_ids.numel() == 3 * (5 + 20)
    assert padded_tokens([RowLength(3, 0)]) == 4  # a trimmed batch keeps one response column


def test_known_lengths_give_known_plans():
    # budget 50: next fit over 0, 2, 4, 5, 1, 3 needs 3: [0, 2] costs 2 x 25, [4, 5, 1] 3 x 14, [3] 4
    assert min_micro_batches(LENGTHS, 50) == 3
    # the plan of 3 keeps the largest smaller: [0] 24, [2, 4] 2 x 24, [5, 1, 3] 3 x 7
    assert plan_micro_batches(LENGTHS, 50, 3) == [[0], [2, 4], [5, 1, 3]]
    # one more micro-batch (another rank needs 4): the largest shrinks to one 24-token row
    assert plan_micro_batches(LENGTHS, 50, 4) == [[0], [2], [4], [5, 1, 3]]
    assert plan_micro_batches(LENGTHS, 50, 6) == [[0], [2], [4], [5], [1], [3]]
    # balanced, not greedy: four equal rows in two micro-batches are two pairs, not 3 + 1
    equal = [RowLength(5, 5)] * 4
    assert plan_micro_batches(equal, 30, 2) == [[0, 1], [2, 3]]


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="a row of 24 tokens exceeds actor.max_tokens_per_micro_batch=23"):
        min_micro_batches(LENGTHS, 23)
    with pytest.raises(ValueError, match="cannot form 7 non-empty micro-batches from 6 rows"):
        plan_micro_batches(LENGTHS, 50, 7)
    with pytest.raises(ValueError, match="need 3 micro-batches of <= 50 padded tokens, not 2"):
        plan_micro_batches(LENGTHS, 50, 2)


def _best_max_cost(lengths, count: int, cost) -> int:
    """Brute force: the smallest largest cost over all cuts of the longest-first order into `count` runs."""
    order = sorted(range(len(lengths)), key=lambda i: (-sum(lengths[i]), i))
    best = None
    for cuts in itertools.combinations(range(1, len(order)), count - 1):
        bounds = (0, *cuts, len(order))
        worst = max(cost([lengths[i] for i in order[a:b]]) for a, b in itertools.pairwise(bounds))
        best = worst if best is None else min(best, worst)
    return best


@pytest.mark.parametrize(("packed", "cost"), [(False, padded_tokens), (True, packed_tokens)])
def test_every_plan_covers_each_row_once_within_budget_and_is_balanced(packed, cost):
    rng = random.Random(0)
    for _ in range(150):
        lengths = [RowLength(rng.randint(1, 12), rng.randint(0, 30)) for _ in range(rng.randint(1, 8))]
        budget = rng.randint(max(cost([r]) for r in lengths), 150)
        fewest = min_micro_batches(lengths, budget, packed)
        for count in range(fewest, len(lengths) + 1):
            plan = plan_micro_batches(lengths, budget, count, packed)
            assert len(plan) == count and all(plan)
            assert sorted(i for rows in plan for i in rows) == list(range(len(lengths)))
            assert all(cost([lengths[i] for i in rows]) <= budget for rows in plan)
            largest = max(cost([lengths[i] for i in rows]) for rows in plan)
            assert largest == _best_max_cost(lengths, count, cost), (lengths, budget, count)


def test_packed_micro_batches_count_real_tokens_only():
    # rows 0 and 2 are long, the rest short: padded, rows 0 + 2 cost 2 x 25 and the short rows
    # go in two more; packed, rows 0 + 2 cost 48 and the four short rows 31 together
    assert packed_tokens(LENGTHS) == 79 and padded_tokens(LENGTHS) == 6 * 25
    assert min_micro_batches(LENGTHS, 50) == 3
    assert min_micro_batches(LENGTHS, 50, packed=True) == 2
    assert plan_micro_batches(LENGTHS, 50, 2, packed=True) == [[0, 2], [4, 5, 1, 3]]


class OtherRankNeeds:
    """The DP all-reduce as rank 0 sees it when rank 1 needs `count` micro-batches."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.ops: list[str] = []

    def all_reduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        self.ops.append(op)
        assert op == "max"
        return torch.maximum(tensor, torch.tensor([self.count], dtype=tensor.dtype))


def settings(budget):
    return UpdateSettings(AlgorithmConfig(), 8, 2, 1.0, 0, 3, max_tokens_per_micro_batch=budget)


def test_every_dp_rank_runs_as_many_micro_batches_as_the_rank_needing_most():
    batch = batch_with_lengths([4, 4, 5, 3, 4, 4], [20, 2, 19, 1, 10, 3])
    alone = micro_batch_rows(OtherRankNeeds(0), batch, settings(50))
    assert alone == [[0], [2, 4], [5, 1, 3]]
    peer = OtherRankNeeds(5)
    assert micro_batch_rows(peer, batch, settings(50)) == plan_micro_batches(LENGTHS, 50, 5)
    assert peer.ops == ["max"] and len(plan_micro_batches(LENGTHS, 50, 5)) == 5


def test_without_a_budget_micro_batches_are_consecutive_rows_and_no_collective_runs():
    peer = OtherRankNeeds(5)
    assert micro_batch_rows(peer, batch_with_lengths([3] * 5, [4] * 5), settings(None)) == [
        [0, 1],
        [2, 3],
        [4],
    ]
    assert peer.ops == []


def test_with_a_budget_micro_batch_size_need_not_divide_the_global_batch():
    # tiny recipe: the longest row is data.max_prompt_length 64 + max_new_tokens 64 (test_config_rules
    # has the refusal of 127); micro_batch_size 24 alone would be refused (64 % 24)
    cfg = load_config(
        "tiny-moe-grpo-cpu", ["actor.max_tokens_per_micro_batch=128", "actor.micro_batch_size=24"]
    )
    assert cfg.actor.max_tokens_per_micro_batch == 128
