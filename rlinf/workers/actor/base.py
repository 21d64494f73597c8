"""The actor role: recomputes logprobs, trains on a RolloutBatch, exports weights, checkpoints.

Every rank of an actor group receives the SAME full batch (one object-store reference, see
rlinf.scheduler.facades.ActorGroup) and takes its own data-parallel rows; `dp_info()` tells the
facade which rank stands for which rows and which ranks report.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

import torch

from rlinf.config.schema import Config
from rlinf.data.batch import RolloutBatch
from rlinf.weight_sync.exporter import WeightExporter, dispatch
from rlinf.workers.actor.policy_update import DPInfo

WeightBucket = list[tuple[str, torch.Tensor]]


class ActorWorker(ABC):
    cfg: Config
    _weight_exporter: WeightExporter | None = None

    @property
    def temperature(self) -> float:
        """What recomputed logits are divided by: the rollout's sampling temperature (1 when greedy),
        so actor and rollout report the same tempered logprob (docs/rollout.md)."""
        t = self.cfg.algorithm.sampling_params.temperature
        return t if t > 0 else 1.0

    @abstractmethod
    def dp_info(self) -> DPInfo:
        """This rank's data-parallel rank and size, and whether it reports for its DP group."""

    @abstractmethod
    def compute_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        """Rows `policy_update.dp_slice(len(batch), dp.rank, dp.size)` of the full batch, with
        old_logprobs (and ref_logprobs when kl_beta > 0) filled by the current policy. Collective:
        every rank is called; the facade concatenates the reporting ranks' results in dp-rank order."""

    @abstractmethod
    def train(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        """One GRPO update over the full batch (policy_update.run_policy_update); collective.
        Returns actor/* metrics already reduced over DP ranks (equal on every reporting rank)."""

    @abstractmethod
    def export_weights(self, bucket_bytes: int) -> list[WeightBucket]:
        """Full weights under HF names, in buckets of at most bucket_bytes (one tensor may exceed it).
        Megatron's export is collective (every rank must drain it); the torch actor's is not."""

    @abstractmethod
    def device_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor on this rank's device) for every weight, one at a time; a fresh
        pass per call. Collective where the backend shards weights (every rank must drain it)."""

    def weight_export(self, verb: str, *args):
        """The GPU weight sync verbs (CUDA IPC / NCCL to SGLang) over `device_weights`; see
        rlinf.weight_sync.exporter. The exporter lives as long as the actor: it keeps the NCCL
        weight-update group between syncs."""
        if self._weight_exporter is None:
            self._weight_exporter = WeightExporter(self.device_weights)
        return dispatch(self._weight_exporter, verb, *args)

    @abstractmethod
    def save(self, directory: str) -> None:
        """Weights (HF format where possible), optimizer, LR schedule and RNG state. Collective:
        every rank is called with the same directory and writes its shard (or nothing)."""

    @abstractmethod
    def load(self, directory: str) -> None:
        """Restore what save wrote (collective); errors name the missing or corrupt file."""

    @abstractmethod
    def offload(self) -> dict[str, float]:
        """Colocated runs: free accelerator memory for the rollout phase. Collective. Returns
        metrics for the step's log (`actor/offload_freed_gib` where a GPU was freed; {} where
        nothing moved)."""

    @abstractmethod
    def onload(self) -> None:
        """Bring weights/optimizer back before compute_logprobs/train."""
