"""A resumable batch loader over an in-memory dataset.

Each epoch's order is a permutation drawn from a generator seeded with (seed, epoch) alone, so the
order of epoch k never depends on how the loader got there: a resumed run only needs
(epoch, index) to yield exactly the batches the uninterrupted run would have yielded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")


def prompts_per_step(data: Any) -> int:
    """Prompts a training step has in flight (a DataConfig): the batch, plus the over-sampled ones
    that the rollout drops (or carries, data.partial_rollout) once the batch's groups are complete
    (data.oversample_prompts)."""
    return int(data.rollout_batch_size + data.oversample_prompts)


def fresh_prompts_per_step(data: Any) -> int:
    """Prompts a training step draws from the data (a DataConfig), and so what an epoch counts
    steps in: all it has in flight, except with data.partial_rollout, whose steps after the first
    carry oversample_prompts groups and draw rollout_batch_size."""
    return int(data.rollout_batch_size) if data.partial_rollout else prompts_per_step(data)


def training_loader(dataset: Sequence[T], cfg: Any) -> PromptLoader[T]:
    """The training prompts' loader of a run (a Config): a batch per step, in the run's order."""
    return PromptLoader(
        dataset, fresh_prompts_per_step(cfg.data), shuffle=cfg.data.shuffle, seed=cfg.runner.seed
    )


class PromptLoader(Generic[T]):
    def __init__(
        self,
        dataset: Sequence[T],
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        drop_last: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(dataset) == 0:
            raise ValueError("the dataset is empty")
        if drop_last and batch_size > len(dataset):
            raise ValueError(
                f"batch_size {batch_size} is larger than the dataset ({len(dataset)} items): "
                "with drop_last no batch could ever be formed"
            )
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self._dataset = dataset
        self._batch_size = batch_size
        self._shuffle = shuffle
        self._seed = seed
        self._drop_last = drop_last
        self._epoch = 0
        self._index = 0
        self._order: np.ndarray | None = None  # the current epoch's permutation, built on first use

    @property
    def epoch(self) -> int:
        """Completed epochs: it ticks over as soon as the last batch of an epoch is taken."""
        return self._epoch

    @property
    def index(self) -> int:
        """Position in the current epoch's order of the next item to be yielded."""
        return self._index

    @property
    def steps_per_epoch(self) -> int:
        full, remainder = divmod(len(self._dataset), self._batch_size)
        return full + int(remainder > 0 and not self._drop_last)

    def next_batch(self, size: int | None = None) -> list[T]:
        """The next `size` items (default: batch_size; a partial rollout's first step draws more),
        at most what is left of the epoch. An epoch ends once fewer than batch_size items are left."""
        size = self._batch_size if size is None else size
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        order = self._epoch_order()
        positions = order[self._index : self._index + size]
        self._index += len(positions)
        self._roll_over_if_epoch_done()
        return [self._dataset[int(i)] for i in positions]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "index": self._index, "seed": self._seed, "size": len(self._dataset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {"epoch", "index", "seed", "size"} - state.keys()
        if missing:
            raise ValueError(f"loader state is missing {sorted(missing)}")
        if state["seed"] != self._seed:
            raise ValueError(
                f"the checkpoint's data seed is {state['seed']} but this run's is {self._seed}: "
                "resuming would change the data order"
            )
        if state["size"] != len(self._dataset):
            raise ValueError(
                f"the checkpoint was taken with {state['size']} items in the dataset but it now has "
                f"{len(self._dataset)}: the data changed since the checkpoint"
            )
        if state["epoch"] < 0 or not 0 <= state["index"] < len(self._dataset):
            raise ValueError(f"loader state out of range: epoch={state['epoch']}, index={state['index']}")
        self._epoch = int(state["epoch"])
        self._index = int(state["index"])
        self._order = None
        # A batch size changed since the checkpoint can leave too few items for a full batch.
        self._roll_over_if_epoch_done()

    def _epoch_order(self) -> np.ndarray:
        if self._order is None:
            size = len(self._dataset)
            if self._shuffle:
                self._order = np.random.default_rng([self._seed, self._epoch]).permutation(size)
            else:
                self._order = np.arange(size)
        return self._order

    def _roll_over_if_epoch_done(self) -> None:
        remaining = len(self._dataset) - self._index
        if remaining == 0 or (self._drop_last and remaining < self._batch_size):
            self._epoch += 1
            self._index = 0
            self._order = None
