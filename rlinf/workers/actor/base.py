"""The actor role: recomputes logprobs, trains on a RolloutBatch, exports weights, checkpoints.

Every rank of an actor group receives the SAME full batch (one object-store reference, see
rlinf.scheduler.facades.ActorGroup) and takes its own data-parallel rows; `dp_info()` tells the
facade which rank stands for which rows and which ranks report. Recomputed logprobs travel as
`LogprobRows` (tensors and a row offset), never as a batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch

from rlinf.config.schema import Config
from rlinf.data.batch import RolloutBatch
from rlinf.data.metrics_merge import merge_metrics
from rlinf.weight_sync.exporter import WeightExporter, dispatch
from rlinf.workers.actor.policy_update import DPInfo, dp_slice

WeightBucket = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class LogprobRows:
    """Recomputed logprobs of rows `start .. start + len(old)` of a batch. Columns are the
    batch's response columns, possibly fewer (trailing padding dropped)."""

    start: int
    old: torch.Tensor  # [rows, <= R] under the current policy
    ref: torch.Tensor | None = None  # [rows, <= R] under the reference policy (kl_beta > 0)
    # The recompute's own metrics (routing replay counts and time), merged by metrics_merge rules
    metrics: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.old.shape[0])


def with_logprobs(batch: RolloutBatch, parts: Sequence[LogprobRows]) -> RolloutBatch:
    """`batch` with old_logprobs (and ref_logprobs) from `parts`, which must cover its rows
    exactly once, in any order."""
    ordered = sorted(parts, key=lambda part: part.start)
    spans = [(part.start, part.start + len(part)) for part in ordered]
    if [a for a, _ in spans] != [0, *(b for _, b in spans[:-1])] or (spans and spans[-1][1] != len(batch)):
        raise RuntimeError(f"actor: logprob rows {spans} do not cover a batch of {len(batch)} rows once")
    if len({part.ref is None for part in ordered}) > 1:
        raise RuntimeError("actor: some data-parallel ranks returned reference logprobs, others none")
    width = batch.response_ids.shape[1]
    old = _rows_at_width([part.old for part in ordered], width)
    refs = [part.ref for part in ordered if part.ref is not None]
    extras = dict(batch.extras)
    if any(part.metrics for part in ordered):
        extras.update(_recompute_metrics(ordered))
    return replace(
        batch, old_logprobs=old, ref_logprobs=_rows_at_width(refs, width) if refs else None, extras=extras
    )


def _recompute_metrics(parts: Sequence[LogprobRows]) -> dict[str, float]:
    """The ranks' recompute metrics merged; routing/agreement from the summed counts."""
    merged = merge_metrics([part.metrics for part in parts], [float(len(part)) for part in parts])
    compared = merged.get("routing/num_compared", 0.0)
    if compared:
        merged["routing/agreement"] = merged["routing/num_agreeing"] / compared
    return merged


def _rows_at_width(parts: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in parts])


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

    def compute_logprobs(self, batch: RolloutBatch) -> LogprobRows | None:
        """Logprobs of this rank's rows `dp_slice(len(batch), dp.rank, dp.size)` of the full batch.
        Collective: every rank computes; only a reporting rank returns them, the others None."""
        dp = self.dp_info()
        rows = dp_slice(len(batch), dp.rank, dp.size)
        mine = batch.select(list(range(rows.start, rows.stop))) if dp.size > 1 else batch
        old, ref = self.policy_logprobs(mine)
        metrics = self.recompute_metrics()
        return LogprobRows(rows.start, old, ref, metrics) if dp.reports else None

    def recompute_metrics(self) -> dict[str, float]:
        """Metrics of the last `policy_logprobs` (routing agreement counts and replay time).
        Collective for sharded backends: every rank calls it."""
        return {}

    @abstractmethod
    def policy_logprobs(self, rows: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tempered logprobs [len(rows), <= R] of the rows' responses under the current policy, and
        under the reference policy when kl_beta > 0 (else None). Collective for sharded backends."""

    def train(self, batch: RolloutBatch, step: int, logprobs: LogprobRows | None = None) -> dict[str, float]:
        """One GRPO update over the full batch; `logprobs` (every row), when given, fill its
        old_logprobs and ref_logprobs first. Collective. Returns actor/* metrics already reduced
        over DP ranks (equal on every reporting rank)."""
        return self.update_policy(batch if logprobs is None else with_logprobs(batch, [logprobs]), step)

    @abstractmethod
    def update_policy(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        """policy_update.run_policy_update over the full batch, with old_logprobs filled."""

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
    def save(self, directory: str) -> int:
        """Weights (HF format where possible), optimizer, LR schedule and RNG state. Collective:
        every rank is called with the same directory and writes its shard (or nothing). Returns
        the optimizer steps taken (the LR schedule's position), which the checkpoint records."""

    @abstractmethod
    def export_hf(self, directory: str) -> None:
        """The current weights as a Hugging Face save_pretrained folder (config and tokenizer
        included) in the existing, empty `directory`. Collective: every rank is called; one writes."""

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
