"""The actor role: recomputes logprobs, trains on a RolloutBatch, exports weights, checkpoints."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from rlinf.data.batch import RolloutBatch

WeightBucket = list[tuple[str, torch.Tensor]]


class ActorWorker(ABC):
    @abstractmethod
    def compute_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        """Fill old_logprobs (and ref_logprobs when kl_beta > 0) with the current policy's values."""

    @abstractmethod
    def train(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        """One GRPO update over the batch (minibatches of actor.global_batch_size); returns actor/* metrics."""

    @abstractmethod
    def export_weights(self, bucket_bytes: int) -> list[WeightBucket]:
        """Full weights under HF names, in buckets of at most bucket_bytes (one tensor may exceed it)."""

    @abstractmethod
    def save(self, directory: str) -> None:
        """Weights (HF format where possible), optimizer, LR schedule and RNG state."""

    @abstractmethod
    def load(self, directory: str) -> None:
        """Restore what save wrote; errors name the missing or corrupt file."""

    @abstractmethod
    def offload(self) -> None:
        """Colocated runs: free accelerator memory for the rollout phase."""

    @abstractmethod
    def onload(self) -> None:
        """Bring weights/optimizer back before compute_logprobs/train."""
