"""Ending a rollout once enough GRPO groups are complete (`data.oversample_prompts`, docs/rollout.md).

A step draws more prompts than it trains on; generation ends as soon as `keep` groups have every
response finished, and the rest are aborted: dropped, or with `data.partial_rollout` carried into
the next step (partial.py). The batch's long tail (the few responses that run to the length limit
while the GPU idles on a shrinking batch) is cut; the price of dropping is a bias towards groups
whose responses end sooner.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any


class GroupQuota:
    """Counts finished responses per group; `met` once `keep` groups are complete.

    Rows are responses, `groups[row]` their group. Groups complete in the order `finish` reports
    them (rows of one call in the order given), which `kept` keeps for the tie at the quota.
    `complete`: groups with no row left to run (partial rollout: carried groups whose responses all
    finished earlier); they count as complete before any row finishes, in the order given.
    """

    def __init__(self, groups: Sequence[int], keep: int, complete: Sequence[int] = ()) -> None:
        if set(groups) & set(complete):
            raise ValueError(f"groups {sorted(set(groups) & set(complete))} have rows but are complete")
        num_groups = len(set(groups) | set(complete))
        if not 1 <= keep <= num_groups:
            raise ValueError(f"keep must be in [1, {num_groups} groups], got {keep}")
        self.groups = list(groups)
        self.keep = keep
        self._unfinished = Counter(self.groups)
        self._finished: set[int] = set()
        self._complete: list[int] = list(complete)  # groups in the order they completed

    def finish(self, rows: Sequence[int]) -> None:
        for row in rows:
            if row in self._finished:
                raise ValueError(f"row {row} finished twice")
            self._finished.add(row)
            group = self.groups[row]
            self._unfinished[group] -= 1
            if self._unfinished[group] == 0:
                self._complete.append(group)

    @property
    def met(self) -> bool:
        return len(self._complete) >= self.keep

    def kept_groups(self) -> list[int]:
        """The first `keep` groups to complete, in ascending order."""
        if not self.met:
            raise RuntimeError(f"only {len(self._complete)} of {self.keep} groups are complete")
        return sorted(self._complete[: self.keep])

    def kept_rows(self) -> list[int]:
        """Rows of the first `keep` groups to complete, in row order."""
        kept = set(self.kept_groups())
        return [row for row, group in enumerate(self.groups) if group in kept]


async def run_until_quota(
    submit: Callable[[int], Awaitable[Any]], quota: GroupQuota, abort: Callable[[int], None]
) -> list[Any]:
    """One request per row (`submit(row)`), all in flight together; once the quota is met the
    unfinished ones are aborted (`abort(row)`) and awaited. Returns each row's result: for an
    aborted row what its request returned after the abort (the output so far, with a partial
    rollout's use for it), None where the aborted request raised."""
    rows = range(len(quota.groups))
    results: list[Any] = [None] * len(quota.groups)

    async def one(row: int) -> int:
        results[row] = await submit(row)
        return row

    pending = {asyncio.ensure_future(one(row)): row for row in rows}
    try:
        while pending and not quota.met:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            finished = sorted(pending.pop(task) for task in done)
            for task in done:
                task.result()  # a failed request fails the rollout
            quota.finish(finished)
    finally:
        for row in pending.values():
            abort(row)
        if pending:  # aborted requests end on their own; an error after the abort is not a failure
            await asyncio.gather(*pending, return_exceptions=True)
    for task, row in pending.items():
        if task.cancelled() or task.exception() is not None:
            results[row] = None
    return results
