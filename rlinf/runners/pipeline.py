"""Rollout ahead of training (runner.max_staleness = k >= 1; docs/rollout.md).

The synchronous loop is the depth-0 case of a pipeline: a producer (draw prompts -> generate ->
score) and a consumer (logprobs -> train -> weights out) joined by a queue of batches tagged with
the policy version that generated them. Version v is the actor after v updates; step s trains at
version s - 1.

- The producer (one thread of the driver; the roles are separate Ray actors, so its generate runs
  while the actor trains) draws the batch of step s once the weights it can load are at least
  version s - 1 - k, and loads the newest it has first. It thus runs at most k versions ahead:
  at most k + 1 batches are drawn and not yet trained.
- After each update the consumer publishes the weights. A snapshot (object store) waits for the
  producer to load it before its next request; a streaming sync (CUDA IPC, NCCL) runs at once,
  after the producer's request in flight: a sync must never interleave with a generate.
- A batch older than k versions when its step comes is never trained: it is generated again with
  the current weights (`regenerate`) or dropped for the next batch (`drop`), and counted. While each
  step trains one batch the producer's gate keeps every batch within the bound; the check guards
  the rule itself.
- A checkpoint resumes at the first batch drawn and not trained: the batches in flight are not
  saved; a resumed run draws and generates them again, with the restored weights.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from rlinf.data.batch import RolloutBatch

WAIT_SLICE_S = 0.5  # condition waits wake this often, so a signal handler in the main thread runs
# A scored batch and its production metrics (time/rollout, time/reward, ...) for (step, prompts).
Produce = Callable[[int, list], tuple[RolloutBatch, dict[str, float]]]


class Loader(Protocol):
    def next_batch(self) -> list: ...
    def state_dict(self) -> dict: ...


@dataclass(frozen=True)
class Produced:
    step: int  # the step it was drawn for (its sampling seed)
    version: int  # the version of the weights that generated it
    prompts: list  # what was drawn; a regeneration generates them again
    position: dict  # the loader's state before the draw: where a run resumes before this batch trains
    batch: RolloutBatch  # scored, every row tagged with `version`
    metrics: dict[str, float]


def tagged(batch: RolloutBatch, version: int) -> RolloutBatch:
    return replace(batch, policy_version=torch.full((len(batch),), version, dtype=torch.long))


def staleness_metrics(policy_version: torch.Tensor, actor_version: int) -> dict[str, float]:
    """How many versions the trained rows lag the actor that trains them."""
    lag = (actor_version - policy_version).float()
    return {"staleness/mean": float(lag.mean()), "staleness/max": float(lag.max())}


class RolloutPipeline:
    def __init__(
        self, loader: Loader, produce: Produce, *, max_staleness: int, stale_samples: str, last_step: int
    ) -> None:
        if max_staleness < 1 or stale_samples not in ("regenerate", "drop"):
            raise ValueError(f"pipeline: max_staleness={max_staleness}, stale_samples={stale_samples!r}")
        self.loader, self.produce = loader, produce
        self.k, self.stale_samples, self.last_step = max_staleness, stale_samples, last_step
        self.cond = threading.Condition()  # guards everything below but the rollout itself
        self.rollout_busy = threading.Lock()  # one user of the rollout at a time: a request, a sync
        self.queue: deque[Produced] = deque()
        self.positions: deque[dict] = deque()  # of the batches drawn and not trained, in draw order
        self.staged: tuple[int, Callable[[], object]] | None = None  # newest snapshot not loaded yet
        self.actor_version = self.rollout_version = self.next_step = 0
        self.failure: BaseException | None = None
        self.stopping = False
        self.producer_wait = 0.0  # since the last step's metrics
        self.thread: threading.Thread | None = None

    # -- the consumer's side (the runner) ---------------------------------------------------------
    def start(self, step: int) -> None:
        """Produce from the batch of step + 1 on; actor and rollout hold version `step`."""
        self.actor_version = self.rollout_version = step
        self.next_step = step + 1
        self.thread = threading.Thread(target=self._produce_loop, name="rollout-producer", daemon=True)
        self.thread.start()

    def next_batch(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """The batch step `step` trains (at version step - 1), within the bound, and the step's
        pipeline metrics."""
        started = time.perf_counter()
        dropped = regenerated = 0
        while True:
            produced = self._take()
            if self.actor_version - produced.version <= self.k:
                break
            if self.stale_samples == "drop":
                dropped += len(produced.batch)
                with self.cond:
                    self.positions.popleft()
                    self.last_step += 1  # one more batch to draw in its place
                    self.cond.notify_all()
                continue
            regenerated += len(produced.batch)
            produced = self._generate(produced.step, produced.prompts, produced.position)
            break
        with self.cond:
            self.positions.popleft()
            producer_wait, self.producer_wait = self.producer_wait, 0.0
        assert produced.batch.policy_version is not None
        return produced.batch, {
            **produced.metrics,
            **staleness_metrics(produced.batch.policy_version, self.actor_version),
            "staleness/dropped_samples": float(dropped),
            "staleness/regenerated_samples": float(regenerated),
            "time/wait_for_rollout": time.perf_counter() - started,
            "time/wait_for_actor": producer_wait,
        }

    def publish(self, version: int, load: Callable[[], object], snapshot: bool) -> None:
        """The actor is at `version`: a snapshot's `load` runs before the producer's next request;
        without a snapshot it runs now, once the request in flight has ended."""
        if snapshot:
            with self.cond:
                self.staged, self.actor_version = (version, load), version
                self.cond.notify_all()
            return
        with self.rollout_busy:
            load()
            with self.cond:
                self.staged, self.actor_version, self.rollout_version = None, version, version
                self.cond.notify_all()

    @contextmanager
    def rollout_current(self) -> Iterator[None]:
        """The rollout to oneself, holding the actor's newest weights (validation)."""
        with self.rollout_busy:
            self._load_staged()
            yield

    def resume_position(self) -> dict:
        """The loader's state a checkpoint taken now resumes at: that of the first batch drawn and
        not trained (the batches in flight are generated again after a resume)."""
        with self.cond:
            return dict(self.positions[0]) if self.positions else self.loader.state_dict()

    def close(self) -> None:
        """Stop drawing; a request in flight ends on its own and its batch is dropped."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    # -- the producer's side ----------------------------------------------------------------------
    def _produce_loop(self) -> None:
        try:
            while True:
                with self.cond:
                    started = time.perf_counter()
                    self._wait(lambda: self.stopping or self._may_draw())
                    self.producer_wait += time.perf_counter() - started
                    if self.stopping:
                        return
                    step, self.next_step = self.next_step, self.next_step + 1
                    position = self.loader.state_dict()
                    prompts = self.loader.next_batch()
                    self.positions.append(position)
                produced = self._generate(step, prompts, position)
                with self.cond:
                    self.queue.append(produced)
                    self.cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, which raises it
            with self.cond:
                self.failure = err
                self.cond.notify_all()

    def _may_draw(self) -> bool:
        newest = self.staged[0] if self.staged else self.rollout_version
        return self.next_step <= self.last_step and newest >= self.next_step - 1 - self.k

    def _generate(self, step: int, prompts: list, position: dict) -> Produced:
        with self.rollout_busy:
            self._load_staged()
            version = self.rollout_version
            batch, metrics = self.produce(step, prompts)
        return Produced(step, version, prompts, position, tagged(batch, version), metrics)

    def _load_staged(self) -> None:
        """Load the newest published snapshot, if any (the caller holds rollout_busy)."""
        with self.cond:
            staged, self.staged = self.staged, None
        if staged is not None:
            version, load = staged
            load()
            with self.cond:
                self.rollout_version = version

    def _take(self) -> Produced:
        with self.cond:
            self._wait(lambda: bool(self.queue) or self.failure is not None)
            if not self.queue:  # what was produced before the failure is trained first
                raise self.failure  # type: ignore[misc]
            return self.queue.popleft()

    def _wait(self, ready: Callable[[], bool]) -> None:
        while not ready():
            self.cond.wait(WAIT_SLICE_S)
