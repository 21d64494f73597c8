"""ActorGroup (rlinf.scheduler.facades) over fake ranks: what crosses between the driver and the
actor ranks, and how the reporting ranks' logprob rows land in the batch."""

import pytest
import ray
import torch
from test_batch_shard_concat import make_batch

from rlinf.data.batch import RolloutBatch
from rlinf.scheduler.facades import ActorGroup
from rlinf.workers.actor.base import ActorWorker, LogprobRows, with_logprobs
from rlinf.workers.actor.policy_update import DPInfo

# Six ranks: three data-parallel groups of two (TP=2); the reporting rank of dp group d sits at a
# worker rank that does not follow dp order.
DP_OF_RANK = [2, 2, 0, 0, 1, 1]
REPORTS = [False, True, True, False, True, False]


def expected_old(batch: RolloutBatch) -> torch.Tensor:
    return batch.rollout_logprobs * 2


class FakePolicy(ActorWorker):
    """One rank: the base class's own compute_logprobs over a fake policy (old = 2 x rollout
    logprobs, trailing padding columns dropped as a real actor's trimmed micro-batches do)."""

    def __init__(self, dp: DPInfo) -> None:
        self.dp = dp

    def dp_info(self) -> DPInfo:
        return self.dp

    def policy_logprobs(self, rows: RolloutBatch) -> tuple[torch.Tensor, None]:
        return expected_old(rows.trimmed()), None

    train = update_policy = export_weights = device_weights = save = None  # type: ignore[assignment]
    load = export_hf = offload = onload = None  # type: ignore[assignment]


class FakeRanks:
    """A WorkerGroup stand-in over FakePolicy ranks; records every call."""

    def __init__(self) -> None:
        self.ranks = [
            FakePolicy(DPInfo(dp, 3, reports)) for dp, reports in zip(DP_OF_RANK, REPORTS, strict=True)
        ]
        self.calls: list[tuple[str, tuple]] = []
        self.returned: list = []

    def __len__(self) -> int:
        return len(self.ranks)

    def call(self, method: str, *args):
        self.calls.append((method, args))
        if method == "dp_info":
            return [rank.dp_info() for rank in self.ranks]
        if method == "compute_logprobs":
            self.returned = [rank.compute_logprobs(*args) for rank in self.ranks]
            return self.returned
        if method == "train":
            return [{"actor/loss": float(rank)} for rank in range(len(self))]
        raise AssertionError(method)


@pytest.fixture
def uploads(monkeypatch) -> list:
    """What the facade puts into the object store (the fake ranks get the object itself)."""
    put: list = []
    monkeypatch.setattr(ray, "put", lambda value: put.append(value) or value)
    return put


def batch_of_seven() -> RolloutBatch:
    return make_batch([3, 2, 4, 1, 2, 3, 2], [5, 2, 3, 1, 4, 2, 1], [0, 0, 1, 1, 2, 2, 3])


def test_the_reporting_ranks_logprob_rows_are_placed_in_the_batch(uploads):
    batch = batch_of_seven()
    ranks = FakeRanks()
    merged = ActorGroup(ranks).compute_logprobs(batch)
    # only the reporting ranks answer, with their dp slice's tensors: rows 0-1, 2-3, 4-6
    assert [None if r is None else (r.start, len(r)) for r in ranks.returned] == [
        None, (4, 3), (0, 2), None, (2, 2), None,
    ]  # fmt: skip
    assert torch.equal(merged.old_logprobs, expected_old(batch))  # every row in place, padded back
    assert merged.ref_logprobs is None
    assert torch.equal(merged.response_ids, batch.response_ids)
    assert uploads == [batch]  # one upload for all six ranks


def test_train_reuses_the_logprob_upload_and_sends_only_the_logprob_tensors(uploads):
    ranks = FakeRanks()
    actor = ActorGroup(ranks)
    batch = batch_of_seven()
    merged = actor.compute_logprobs(batch)
    metrics = actor.train(merged, 3)
    assert metrics == {"actor/loss": 2.0}  # the reporting rank of dp rank 0
    method, (sent, step, logprobs) = ranks.calls[-1]
    assert (method, sent, step) == ("train", batch, 3)  # the batch compute_logprobs uploaded
    assert isinstance(logprobs, LogprobRows) and logprobs.start == 0
    assert logprobs.old is merged.old_logprobs
    assert [type(u) for u in uploads] == [RolloutBatch, LogprobRows]  # the batch went up once

    # The ranks' train rebuilds the batch the driver holds.
    rebuilt = with_logprobs(sent, [logprobs])
    assert torch.equal(rebuilt.old_logprobs, merged.old_logprobs)

    # Any other batch (or a second train) is uploaded whole.
    actor.train(merged, 4)
    assert ranks.calls[-1][1] == (merged, 4) and uploads[-1] is merged


def test_rows_that_do_not_cover_the_batch_once_are_refused():
    batch = batch_of_seven()
    old = torch.zeros(3, 2)
    with pytest.raises(RuntimeError, match=r"logprob rows \[\(0, 3\), \(3, 6\)\] do not cover a batch of 7"):
        with_logprobs(batch, [LogprobRows(3, old), LogprobRows(0, old)])
    with pytest.raises(RuntimeError, match=r"\[\(0, 3\), \(2, 5\)"):
        with_logprobs(batch, [LogprobRows(0, old), LogprobRows(2, old), LogprobRows(5, old[:2])])
    with pytest.raises(RuntimeError, match="reference logprobs"):
        with_logprobs(batch, [LogprobRows(0, old, old), LogprobRows(3, torch.zeros(4, 2))])
