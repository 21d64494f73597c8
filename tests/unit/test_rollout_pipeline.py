"""rlinf/runners/pipeline.py driven by fake roles with random phase timings: whatever the timings,
no trained row lags the actor by more than runner.max_staleness, its tag is the version that really
generated it, a weight load never interleaves with a generate, nothing is lost or trained twice, and
the staleness metrics say what happened."""

import random
import threading
import time

import pytest
import torch

from rlinf.data.batch import RolloutBatch
from rlinf.runners.pipeline import RolloutPipeline

ROWS = 2  # rows per fake batch


class FakeLoader:
    def __init__(self) -> None:
        self.index = 0

    def next_batch(self) -> list:
        self.index += 1
        return [self.index - 1]

    def state_dict(self) -> dict:
        return {"index": self.index}


class FakeRollout:
    """Generates after a random delay; records the weights each batch really came from."""

    def __init__(self, rng: random.Random, fail_at: int | None = None) -> None:
        self.rng, self.fail_at = rng, fail_at
        self.weights = 0  # the version loaded
        self.busy = threading.Lock()
        self.made: list[tuple[int, int]] = []  # (prompt, weights version) per produced batch

    def produce(self, step: int, prompts: list) -> tuple[RolloutBatch, dict[str, float]]:
        assert self.busy.acquire(blocking=False), "two requests at once"
        try:
            if step == self.fail_at:
                raise RuntimeError("rollout worker (rank 0) died")
            version = self.weights
            time.sleep(self.rng.uniform(0, 0.003))
            assert self.weights == version, "weights changed during a generate"
            self.made.append((prompts[0], version))
            return _batch(prompts[0], version), {"time/rollout": 0.0}
        finally:
            self.busy.release()

    def loader_of(self, version: int):
        def load() -> None:
            assert self.busy.acquire(blocking=False), "a weight load interleaved with a generate"
            self.weights = version
            self.busy.release()

        return load


def _batch(prompt: int, version: int) -> RolloutBatch:
    # The prompt rides in the prompt ids and the generating version in the logprobs, so the test can
    # check the pipeline's tag against what the fake really did.
    return RolloutBatch(
        prompt_ids=torch.full((ROWS, 1), prompt),
        prompt_mask=torch.ones(ROWS, 1, dtype=torch.bool),
        response_ids=torch.zeros(ROWS, 1, dtype=torch.long),
        response_mask=torch.ones(ROWS, 1, dtype=torch.bool),
        group_index=torch.zeros(ROWS, dtype=torch.long),
        rollout_logprobs=torch.full((ROWS, 1), float(version)),
        finish_reasons=["stop"] * ROWS,
        response_text=[""] * ROWS,
        solutions=[("0",)] * ROWS,
    )


def _drive(k: int, stale_samples: str, snapshot: bool, seed: int, steps: int, jumps: bool):
    """Train `steps` steps; with `jumps` an update sometimes advances the actor by 2 versions (as a
    step that trains twice would), which outruns the producer's gate and makes stale batches."""
    rng = random.Random(seed)
    loader, rollout = FakeLoader(), FakeRollout(random.Random(seed + 1))
    pipe = RolloutPipeline(
        loader, rollout.produce, max_staleness=k, stale_samples=stale_samples, last_step=steps
    )
    pipe.start(0)
    version, trained, stale, ahead = 0, [], {"dropped": 0.0, "regenerated": 0.0}, []
    try:
        for step in range(1, steps + 1):
            batch, metrics = pipe.next_batch(step)
            lags = version - batch.policy_version
            assert int(lags.max()) <= k, f"step {step} trains rows {lags.tolist()} versions old"
            # the tag is the version the fake rollout really generated with
            assert torch.equal(batch.policy_version.float(), batch.rollout_logprobs[:, 0])
            assert metrics["staleness/max"] == float(lags.max())
            assert metrics["staleness/mean"] == pytest.approx(float(lags.float().mean()))
            stale["dropped"] += metrics["staleness/dropped_samples"]
            stale["regenerated"] += metrics["staleness/regenerated_samples"]
            trained.append(int(batch.prompt_ids[0, 0]))
            ahead.append(loader.index - len(trained) - stale["dropped"] / ROWS)
            if not jumps:  # a checkpoint now resumes right after the trained batches
                assert pipe.resume_position() == {"index": len(trained)}
            time.sleep(rng.uniform(0, 0.003))  # logprobs + train
            version += 2 if jumps and rng.random() < 0.3 else 1
            pipe.publish(version, rollout.loader_of(version), snapshot)
    finally:
        pipe.close()
        pipe.thread.join(timeout=10)
    return trained, stale, ahead, rollout, pipe


@pytest.mark.parametrize("snapshot", [True, False], ids=["snapshot", "streaming"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_no_trained_row_is_older_than_the_bound_and_the_producer_stays_k_ahead(k, snapshot):
    for seed in range(3):
        trained, stale, ahead, rollout, pipe = _drive(k, "regenerate", snapshot, seed, 60, jumps=False)
        assert trained == list(range(60))  # every batch once, in order
        assert stale == {"dropped": 0.0, "regenerated": 0.0}  # one batch a step: the gate alone holds
        # drawn and not trained once a step has its batch: at most k (k + 1 with the one in training)
        assert 1 <= max(ahead) <= k  # ... and it did run ahead
        # the producer stops at the last step: nothing drawn past it
        assert rollout.made[-1][0] == 59 and not pipe.queue


@pytest.mark.parametrize("stale_samples", ["regenerate", "drop"])
def test_batches_outrun_by_the_actor_are_regenerated_or_dropped_and_counted(stale_samples):
    for seed in range(4):
        trained, stale, _, rollout, pipe = _drive(1, stale_samples, True, seed, 80, jumps=True)
        made_rows, left_rows = ROWS * len(rollout.made), ROWS * len(pipe.queue)
        if stale_samples == "regenerate":
            assert trained == list(range(80))  # the same prompts, generated again
            assert stale["dropped"] == 0 and stale["regenerated"] > 0
            assert made_rows == ROWS * len(trained) + stale["regenerated"] + left_rows
        else:
            assert trained == sorted(set(trained)) and stale["regenerated"] == 0 and stale["dropped"] > 0
            skipped = set(range(trained[-1])) - set(trained)  # prompts drawn, not trained: dropped
            assert stale["dropped"] == ROWS * len(skipped)
            assert made_rows == ROWS * len(trained) + stale["dropped"] + left_rows


def test_a_producer_failure_reaches_the_trainer():
    rollout = FakeRollout(random.Random(0), fail_at=3)
    pipe = RolloutPipeline(
        FakeLoader(), rollout.produce, max_staleness=1, stale_samples="regenerate", last_step=10
    )
    pipe.start(0)
    try:
        for step in (1, 2):
            pipe.next_batch(step)
            pipe.publish(step, rollout.loader_of(step), True)
        with pytest.raises(RuntimeError, match=r"rollout worker \(rank 0\) died"):
            pipe.next_batch(3)
    finally:
        pipe.close()


def test_validation_sees_the_newest_weights():
    rollout = FakeRollout(random.Random(0))
    pipe = RolloutPipeline(
        FakeLoader(), rollout.produce, max_staleness=2, stale_samples="regenerate", last_step=3
    )
    pipe.start(0)
    try:
        pipe.next_batch(1)
        pipe.publish(1, rollout.loader_of(1), True)
        with pipe.rollout_current():
            assert rollout.weights == 1 and rollout.busy.acquire(blocking=False)  # no request in flight
            rollout.busy.release()
    finally:
        pipe.close()
