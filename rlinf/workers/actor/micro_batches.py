"""Micro-batches by token budget (`actor.max_tokens_per_micro_batch`): which rows run together.

A micro-batch is trimmed before its forward (RolloutBatch.trimmed): it keeps the columns of its
longest prompt and of its longest response, so one forward costs

    padded tokens = rows x (longest prompt + longest response)

padding included. Rows are sorted longest first, so rows of similar length share a micro-batch and
little of that cost is padding. Pure functions of the rows' lengths: every rank of a tensor-parallel
group holds the same rows and so computes the same plan.

Data-parallel ranks must all run the same number of forwards (tensor- and expert-parallel
collectives run inside each one), so the caller takes the largest `min_micro_batches` over the DP
ranks and asks every rank for exactly that many (`plan_micro_batches`). A rank can always form
`count` micro-batches when `count` <= its rows: every row fits alone, and splitting a micro-batch
never raises its cost. run_policy_update gives every rank the same number of rows (global batch
divisible by the DP size), and a rank's minimum count never exceeds its rows, so this holds there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class RowLength(NamedTuple):
    prompt: int  # real prompt tokens
    response: int  # real response tokens


def padded_tokens(lengths: Sequence[RowLength]) -> int:
    """What one forward over these rows costs once trimmed (a trimmed batch keeps >= 1 response column)."""
    return len(lengths) * (max(r.prompt for r in lengths) + max(1, *(r.response for r in lengths)))


def min_micro_batches(lengths: Sequence[RowLength], budget: int) -> int:
    """The fewest micro-batches of at most `budget` padded tokens: next-fit over the longest-first
    order, which is the minimum for cuts of that order (extending a run never lowers its cost)."""
    _check_rows_fit(lengths, budget)
    return len(_cut(_longest_first(lengths), lengths, budget))


def plan_micro_batches(lengths: Sequence[RowLength], budget: int, count: int) -> list[list[int]]:
    """Exactly `count` micro-batches (row indices, longest rows first), each of at most `budget`
    padded tokens, balanced: the largest micro-batch is as small as cuts of the longest-first order
    allow. `count` must lie between `min_micro_batches(lengths, budget)` and the number of rows."""
    _check_rows_fit(lengths, budget)
    if not 1 <= count <= len(lengths):
        raise ValueError(f"cannot form {count} non-empty micro-batches from {len(lengths)} rows")
    order = _longest_first(lengths)
    # The smallest per-micro-batch limit whose cut needs at most `count` micro-batches.
    low, high = max(padded_tokens([row]) for row in lengths), budget
    while low < high:
        middle = (low + high) // 2
        if len(_cut(order, lengths, middle)) <= count:
            high = middle
        else:
            low = middle + 1
    groups = _cut(order, lengths, low)
    if len(groups) > count:
        raise ValueError(
            f"{len(lengths)} rows need {len(groups)} micro-batches of <= {budget} padded tokens, not {count}"
        )
    while len(groups) < count:
        _split_costliest(groups, lengths)
    return groups


def _check_rows_fit(lengths: Sequence[RowLength], budget: int) -> None:
    longest = max((padded_tokens([row]) for row in lengths), default=0)
    if longest > budget:
        raise ValueError(
            f"a row of {longest} tokens exceeds actor.max_tokens_per_micro_batch={budget} "
            "(validation requires it >= data.max_prompt_length + algorithm.sampling_params.max_new_tokens)"
        )


def _longest_first(lengths: Sequence[RowLength]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (-(lengths[i].prompt + lengths[i].response), i))


def _cut(order: list[int], lengths: Sequence[RowLength], limit: int) -> list[list[int]]:
    """Consecutive runs of `order`, each extended while its padded tokens stay <= limit."""
    groups: list[list[int]] = []
    current: list[int] = []
    prompt = response = 0
    for i in order:
        grown_prompt, grown_response = max(prompt, lengths[i].prompt), max(response, lengths[i].response, 1)
        if current and (len(current) + 1) * (grown_prompt + grown_response) > limit:
            groups.append(current)
            current, grown_prompt, grown_response = [], lengths[i].prompt, max(1, lengths[i].response)
        current.append(i)
        prompt, response = grown_prompt, grown_response
    if current:
        groups.append(current)
    return groups


def _split_costliest(groups: list[list[int]], lengths: Sequence[RowLength]) -> None:
    """Split the costliest micro-batch of 2+ rows where its larger half is smallest (in place)."""

    def cost(rows: list[int]) -> int:
        return padded_tokens([lengths[i] for i in rows])

    k = max((k for k in range(len(groups)) if len(groups[k]) > 1), key=lambda k: cost(groups[k]))
    rows = groups[k]
    at = min(range(1, len(rows)), key=lambda a: max(cost(rows[:a]), cost(rows[a:])))
    groups[k : k + 1] = [rows[:at], rows[at:]]
