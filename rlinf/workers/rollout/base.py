"""The rollout role: samples responses with token logprobs; takes weights from the actor."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from rlinf.data.batch import RolloutBatch
from rlinf.data.datasets import PromptItem
from rlinf.workers.rollout.sampling import SamplingParams

WeightBucket = list[tuple[str, torch.Tensor]]


class RolloutWorker(ABC):
    @abstractmethod
    def generate(
        self, prompts: Sequence[PromptItem], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        """n responses per prompt; rows of one prompt share a group index."""

    @abstractmethod
    def update_weights(self, buckets: Sequence[WeightBucket]) -> None:
        """Load the actor's weights (HF names) into the engine."""

    @abstractmethod
    def sleep(self) -> None:
        """Colocated runs: release accelerator memory during training."""

    @abstractmethod
    def wake(self) -> None:
        """Re-acquire memory before generate."""
