"""Micro-batches by token budget (`actor.max_tokens_per_micro_batch`): which rows run together.

A micro-batch is trimmed before its forward (RolloutBatch.trimmed): it keeps the columns of its
longest prompt and of its longest response, so one forward costs

    padded tokens = rows x (longest prompt + longest response)

padding included. Rows are sorted longest first, so rows of similar length share a micro-batch and
little of that cost is padding. Packed (`actor.pack_sequences`), a forward runs only the rows' real
tokens, so it costs their sum (`packed=True` below). Pure functions of the rows' lengths: every
rank of a tensor-parallel group holds the same rows and so computes the same plan.

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


def packed_tokens(lengths: Sequence[RowLength]) -> int:
    """What one packed forward over these rows costs: their real tokens."""
    return sum(r.prompt + r.response for r in lengths)


def micro_batch_cost(lengths: Sequence[RowLength], packed: bool = False) -> int:
    return packed_tokens(lengths) if packed else padded_tokens(lengths)


def min_micro_batches(lengths: Sequence[RowLength], budget: int, packed: bool = False) -> int:
    """The fewest micro-batches of at most `budget` tokens: next-fit over the longest-first order,
    which is the minimum for cuts of that order (extending a run never lowers its cost)."""
    _check_rows_fit(lengths, budget, packed)
    return len(_cut(_longest_first(lengths), lengths, budget, packed))


def plan_micro_batches(
    lengths: Sequence[RowLength], budget: int, count: int, packed: bool = False
) -> list[list[int]]:
    """Exactly `count` micro-batches (row indices, longest rows first), each of at most `budget`
    tokens, balanced: the largest micro-batch is as small as cuts of the longest-first order allow.
    `count` must lie between `min_micro_batches(lengths, budget, packed)` and the number of rows."""
    _check_rows_fit(lengths, budget, packed)
    if not 1 <= count <= len(lengths):
        raise ValueError(f"cannot form {count} non-empty micro-batches from {len(lengths)} rows")
    order = _longest_first(lengths)
    # The smallest per-micro-batch limit whose cut needs at most `count` micro-batches.
    low, high = max(micro_batch_cost([row], packed) for row in lengths), budget
    while low < high:
        middle = (low + high) // 2
        if len(_cut(order, lengths, middle, packed)) <= count:
            high = middle
        else:
            low = middle + 1
    groups = _cut(order, lengths, low, packed)
    if len(groups) > count:
        raise ValueError(
            f"{len(lengths)} rows need {len(groups)} micro-batches of <= {budget} "
            f"{'packed' if packed else 'padded'} tokens, not {count}"
        )
    while len(groups) < count:
        _split_costliest(groups, lengths, packed)
    return groups


def _check_rows_fit(lengths: Sequence[RowLength], budget: int, packed: bool) -> None:
    longest = max((micro_batch_cost([row], packed) for row in lengths), default=0)
    if longest > budget:
        raise ValueError(
            f"a row of {longest} tokens exceeds actor.max_tokens_per_micro_batch={budget} "
            "(validation requires it >= data.max_prompt_length + algorithm.sampling_params.max_new_tokens)"
        )


def _longest_first(lengths: Sequence[RowLength]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (-(lengths[i].prompt + lengths[i].response), i))


def _cut(order: list[int], lengths: Sequence[RowLength], limit: int, packed: bool) -> list[list[int]]:
    """Consecutive runs of `order`, each extended while its cost stays <= limit."""
    groups: list[list[int]] = []
    current: list[int] = []
    prompt = response = total = 0
    for i in order:
        row = lengths[i]
        grown_prompt, grown_response = max(prompt, row.prompt), max(response, row.response, 1)
        grown_total = total + row.prompt + row.response
        cost = grown_total if packed else (len(current) + 1) * (grown_prompt + grown_response)
        if current and cost > limit:
            groups.append(current)
            current, grown_prompt, grown_response = [], row.prompt, max(1, row.response)
            grown_total = row.prompt + row.response
        current.append(i)
        prompt, response, total = grown_prompt, grown_response, grown_total
    if current:
        groups.append(current)
    return groups


def _split_costliest(groups: list[list[int]], lengths: Sequence[RowLength], packed: bool) -> None:
    """Split the costliest micro-batch of 2+ rows where its larger half is smallest (in place)."""

    def cost(rows: list[int]) -> int:
        return micro_batch_cost([lengths[i] for i in rows], packed)

    k = max((k for k in range(len(groups)) if len(groups[k]) > 1), key=lambda k: cost(groups[k]))
    rows = groups[k]
    at = min(range(1, len(rows)), key=lambda a: max(cost(rows[:a]), cost(rows[a:])))
    groups[k : k + 1] = [rows[:at], rows[at:]]
