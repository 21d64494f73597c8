"""Ending a rollout once enough groups are complete (data.oversample_prompts): the quota, the
request runner that aborts the rest, the per-engine split, and the torch sampler's early stop."""

import asyncio

import pytest
import torch

from rlinf.models.tiny import SMALL_SETTINGS, random_deepseek_v3
from rlinf.scheduler.facades import contiguous_shares, quota_shares
from rlinf.workers.rollout.group_quota import GroupQuota, run_until_quota
from rlinf.workers.rollout.sampling import SamplingParams, sample


def test_quota_keeps_the_first_groups_to_complete():
    quota = GroupQuota([0, 0, 1, 1, 2, 2], keep=2)
    quota.finish([0, 2, 3])  # group 1 complete
    assert not quota.met
    quota.finish([5, 4])  # group 2 complete (row order within a call is the caller's)
    assert quota.met and quota.kept_rows() == [2, 3, 4, 5]
    quota.finish([1])  # group 0 completes later: not kept
    assert quota.kept_rows() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="row 1 finished twice"):
        quota.finish([1])
    with pytest.raises(ValueError, match=r"keep must be in \[1, 3 groups\]"):
        GroupQuota([0, 0, 1, 1, 2, 2], keep=4)
    with pytest.raises(RuntimeError, match="only 0 of 1 groups are complete"):
        GroupQuota([0, 1], keep=1).kept_rows()


def test_run_until_quota_aborts_the_unfinished_requests():
    # Rows 0-3 (groups 0, 1) answer at once; rows 4-5 (group 2) would run until aborted.
    aborted: list[int] = []

    async def main():
        released = {row: asyncio.Event() for row in (4, 5)}

        async def submit(row: int):
            if row in released:
                await released[row].wait()
                if row == 5:
                    raise ConnectionError("the engine dropped the aborted request")
                return "aborted reply"
            await asyncio.sleep(0.01 * row)
            return f"reply {row}"

        def abort(row: int) -> None:
            aborted.append(row)
            released[row].set()

        quota = GroupQuota([0, 0, 1, 1, 2, 2], keep=2)
        return quota, await asyncio.wait_for(run_until_quota(submit, quota, abort), timeout=5)

    quota, results = asyncio.run(main())
    assert sorted(aborted) == [4, 5]
    # an aborted row returns what its request returned after the abort (None where it raised)
    assert results == ["reply 0", "reply 1", "reply 2", "reply 3", "aborted reply", None]
    assert quota.kept_rows() == [0, 1, 2, 3]


def test_a_failed_request_fails_the_rollout_and_aborts_the_rest():
    aborted: list[int] = []

    async def main():
        gate = asyncio.Event()

        async def submit(row: int):
            if row == 0:
                raise RuntimeError("engine said no")
            await gate.wait()

        def abort(row: int) -> None:
            aborted.append(row)
            gate.set()

        await asyncio.wait_for(run_until_quota(submit, GroupQuota([0, 1], keep=1), abort), timeout=5)

    with pytest.raises(RuntimeError, match="engine said no"):
        asyncio.run(main())
    assert aborted == [1]


@pytest.mark.parametrize("engines", [1, 2, 3, 5, 8])
def test_quota_shares_fit_each_engines_prompts(engines):
    for keep in range(1, 30):
        for extra in range(0, 12):
            sizes = [len(s) for s in contiguous_shares(range(keep + extra), engines)]
            shares = quota_shares(sizes, keep)
            assert sum(shares) == keep and all(0 <= q <= s for q, s in zip(shares, sizes, strict=True))
    assert quota_shares([3, 3], 4) == [2, 2]
    with pytest.raises(ValueError, match="cannot keep 7 of 6"):
        quota_shares([3, 3], 7)


def completion_order(lengths: list[int], n: int, chunk_rows: int) -> list[int]:
    """Groups in the order the sampler completes them: by chunk, then by the step of the group's
    last response, then by that response's row (rows finishing in one step are taken in order)."""
    groups = range(len(lengths) // n)

    def key(g: int):
        rows = range(g * n, (g + 1) * n)
        last = max(lengths[r] for r in rows)
        return (g * n // chunk_rows, last, max(r for r in rows if lengths[r] == last))

    return sorted(groups, key=key)


@pytest.mark.parametrize("chunk_rows", [24, 8])
def test_sampler_stops_at_the_quota_and_the_kept_rows_are_the_full_runs(chunk_rows):
    torch.manual_seed(0)
    model = random_deepseek_v3(SMALL_SETTINGS, vocab_size=64, eos_token_id=1)
    n, keep = 4, 3
    prompts = [[5 + (row // n) % 50, 7, 9 + row // n] for row in range(6 * n)]
    params = SamplingParams(max_new_tokens=40)
    eos = list(range(1, 9))  # one token in 8 ends a response: lengths vary from row to row

    def run(quota=None):
        return sample(
            model, prompts, params, eos_token_ids=eos, pad_token_id=0, max_batch_size=chunk_rows,
            generator=torch.Generator().manual_seed(3), quota=quota,
        )  # fmt: skip

    full = run()
    lengths = full.response_mask.sum(1).tolist()
    quota = GroupQuota([row // n for row in range(len(prompts))], keep)
    cut = run(quota)
    expected = sorted(completion_order(lengths, n, chunk_rows)[:keep])
    kept = quota.kept_rows()
    assert kept == [g * n + i for g in expected for i in range(n)]
    for row in kept:  # the same tokens and logprobs as without the quota: it only ended earlier
        width = lengths[row]
        assert torch.equal(cut.response_ids[row, :width], full.response_ids[row, :width])
        assert torch.equal(cut.logprobs[row, :width], full.logprobs[row, :width])
        assert cut.finish_reasons[row] == full.finish_reasons[row] != "abort"
    dropped = [row for row in range(len(prompts)) if row not in kept]
    assert "abort" in [cut.finish_reasons[row] for row in dropped]
    assert cut.response_mask.sum() < full.response_mask.sum()  # fewer tokens decoded
