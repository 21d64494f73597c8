"""The GRPO policy update shared by every actor backend (torch DDP, Megatron).

`run_policy_update(backend, batch, settings, step, skips)` trains on one step's batch. Every
data-parallel rank calls it with the SAME full batch and takes its own rows:

    shuffle the batch (seed + step, identical on every rank)
    for each minibatch of actor.global_batch_size rows:
        this DP rank's slice; LossNormalizer from GLOBAL token / sequence counts (all-reduced)
        zero_grad; forward_backward(micro-batches, loss_fn); metrics all-reduced
        early stop and NaN skip from all-reduced values (every rank takes the same branch)
        clip_grad_norm (global norm); optimizer_step()

Why this shape: the minibatch is cut before the DP split, so N ranks compute the same update as
one; every rank runs as many micro-batches (rlinf.workers.actor.micro_batches) because each forward
runs tensor- and expert-parallel collectives; each micro-batch loss is its contribution to the
global mean (rlinf.algorithms.aggregation) times `backend.backward_scale`, because DDP and
megatron-core average gradients over DP ranks while the loss needs their sum.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from rlinf.algorithms import LossNormalizer, compute_policy_loss, reduce_metrics, should_early_stop
from rlinf.config.schema import AlgorithmConfig, Config
from rlinf.data.batch import RolloutBatch
from rlinf.workers.actor.micro_batches import RowLength, min_micro_batches, plan_micro_batches
from rlinf.workers.actor.staging import scalars_to_host


class TrainingDivergedError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient norm."""


@dataclass(frozen=True)
class DPInfo:
    """Where a rank sits in data parallelism. `reports`: this rank returns its DP group's results
    (Megatron: one rank per TP x PP x CP group, e.g. TP rank 0 of the last pipeline stage)."""

    rank: int = 0
    size: int = 1
    reports: bool = True


def dp_slice(num_rows: int, dp_rank: int, dp_size: int) -> slice:
    """Contiguous rows of `num_rows` owned by `dp_rank`; sizes differ by at most one."""
    return slice(dp_rank * num_rows // dp_size, (dp_rank + 1) * num_rows // dp_size)


@dataclass(frozen=True)
class UpdateSettings:
    algorithm: AlgorithmConfig
    global_batch_size: int  # rows per optimizer step, over all DP ranks
    micro_batch_size: int  # rows per forward/backward on one rank
    clip_grad: float
    seed: int
    max_consecutive_skips: int
    max_tokens_per_micro_batch: int | None = None  # tokens per forward; None: micro_batch_size rows
    pack_sequences: bool = False  # a forward runs its rows' real tokens only (torch backend)
    logprob_micro_batch_size: int | None = None  # the logprob pass's; None: micro_batch_size
    logprob_max_tokens_per_micro_batch: int | None = None  # None: max_tokens_per_micro_batch

    @classmethod
    def from_config(cls, cfg: Config) -> UpdateSettings:
        return cls(
            algorithm=cfg.algorithm,
            global_batch_size=cfg.actor.global_batch_size,
            micro_batch_size=cfg.actor.micro_batch_size,
            clip_grad=cfg.actor.optim.clip_grad,
            seed=cfg.runner.seed,
            max_consecutive_skips=cfg.runner.max_consecutive_skips,
            max_tokens_per_micro_batch=cfg.actor.max_tokens_per_micro_batch,
            pack_sequences=cfg.actor.pack_sequences,
            logprob_micro_batch_size=cfg.actor.logprob_micro_batch_size,
            logprob_max_tokens_per_micro_batch=cfg.actor.logprob_max_tokens_per_micro_batch,
        )

    def for_logprobs(self) -> UpdateSettings:
        """The micro-batch sizes of the logprob pass (the same way of forming them as training's)."""
        return replace(
            self,
            micro_batch_size=self.logprob_micro_batch_size or self.micro_batch_size,
            max_tokens_per_micro_batch=(
                self.logprob_max_tokens_per_micro_batch or self.max_tokens_per_micro_batch
            ),
        )


@dataclass
class SkipCounter:
    """Non-finite steps; part of the actor's checkpoint so a resumed run counts on."""

    consecutive: int = 0
    total: int = 0

    def skipped(self, limit: int) -> None:
        self.consecutive += 1
        self.total += 1
        if self.consecutive > limit:
            raise TrainingDivergedError(
                f"{self.consecutive} consecutive optimizer steps had a non-finite loss or grad norm "
                f"(runner.max_consecutive_skips={limit}); stopping before the weights or a checkpoint are corrupted"
            )

    def stepped(self) -> None:
        self.consecutive = 0


@dataclass(frozen=True)
class MicroLoss:
    backward_loss: torch.Tensor  # contribution x backend.backward_scale: what backward receives
    metrics: dict[str, torch.Tensor]  # unscaled contributions (see reduce_metrics)


LossFn = Callable[[RolloutBatch, torch.Tensor, torch.Tensor | None], MicroLoss]


class PolicyUpdateBackend(ABC):
    """The hooks `run_policy_update` drives.

    - `dp` (DPInfo): this rank's data-parallel rank and size.
    - `forward_micro(micro) -> (logprobs, entropy)`: [b, R] tensors on `device` for a TRIMMED
      micro-batch, logprobs with grad, temperature-scaled like the rollout. Only used by the
      default `forward_backward`; a backend with its own schedule (Megatron pipeline) overrides
      `forward_backward(micros, loss_fn)` and calls `loss_fn(micro, logprobs, entropy)` inside
      it, backpropagating the returned `MicroLoss.backward_loss`.
    - `backward(loss)`: accumulate gradients (default `loss.backward()`).
    - `all_reduce(tensor, op)`: op "sum" or "max" over the DP group; returns the reduced tensor
      (on CPU, same dtype). Identity with one rank.
    - `zero_grad()`, `clip_grad_norm(max_norm) -> float` (the GLOBAL pre-clip norm, same on every
      rank; non-finite allowed, it triggers a skip), `optimizer_step()` (optimizer and LR
      schedule), `current_lr() -> float`.
    """

    dp: DPInfo = DPInfo()
    device: torch.device = torch.device("cpu")

    @property
    def backward_scale(self) -> float:
        """Factor on each micro-batch loss before backward: dp.size for mean-reducing DDP."""
        return float(self.dp.size)

    @abstractmethod
    def forward_micro(self, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def forward_backward(
        self, micros: Sequence[RolloutBatch], loss_fn: LossFn
    ) -> list[dict[str, torch.Tensor]]:
        metrics = []
        for micro in micros:
            logprobs, entropy = self.forward_micro(micro)
            out = loss_fn(micro, logprobs, entropy)
            self.backward(out.backward_loss)
            metrics.append(out.metrics)
        return metrics

    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor: ...

    @abstractmethod
    def zero_grad(self) -> None: ...

    @abstractmethod
    def clip_grad_norm(self, max_norm: float) -> float: ...

    @abstractmethod
    def optimizer_step(self) -> None: ...

    @abstractmethod
    def current_lr(self) -> float: ...


def run_policy_update(
    backend: PolicyUpdateBackend,
    batch: RolloutBatch,
    settings: UpdateSettings,
    step: int,
    skips: SkipCounter,
) -> dict[str, float]:
    """One GRPO update over the whole step batch; returns actor/* metrics, equal on every rank."""
    gbs, dp = settings.global_batch_size, backend.dp
    if gbs % dp.size:
        raise ValueError(
            f"actor.global_batch_size {gbs} is not divisible by the data-parallel size {dp.size}"
        )
    order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(settings.seed + step))
    shuffled = batch.select(order)
    per_minibatch, early_stopped, skipped = [], 0, 0
    for minibatch in shuffled.split(gbs):
        local = minibatch.select(list(range(len(minibatch)))[dp_slice(len(minibatch), dp.rank, dp.size)])
        micros = [local.select(rows).trimmed() for rows in micro_batch_rows(backend, local, settings)]
        normalizer = LossNormalizer.from_masks(
            [m.response_mask for m in micros], all_reduce_sum=lambda t: backend.all_reduce(t, "sum")
        )
        backend.zero_grad()
        loss_fn = _loss_fn(backend, settings.algorithm, normalizer)
        per_micro = scalars_to_host(backend.forward_backward(micros, loss_fn))  # one device->host read
        metrics = all_reduce_metrics(backend, reduce_metrics(per_micro))
        if should_early_stop(metrics["actor/ratio_mean"], settings.algorithm.early_stop_imp_ratio):
            backend.zero_grad()
            early_stopped += 1
            continue
        grad_norm = backend.clip_grad_norm(settings.clip_grad)
        metrics["actor/grad_norm"] = grad_norm
        nonfinite = torch.tensor(
            [float(not math.isfinite(grad_norm)), float(not math.isfinite(metrics["actor/loss"]))],
            dtype=torch.float64,
        )
        if bool(backend.all_reduce(nonfinite, "sum").sum() > 0):
            backend.zero_grad()
            skips.skipped(settings.max_consecutive_skips)
            skipped += 1
            continue
        backend.optimizer_step()
        skips.stepped()
        per_minibatch.append(metrics)
    summary = mean_over_minibatches(per_minibatch)
    summary.update(
        {
            "actor/early_stopped_minibatches": float(early_stopped),
            "actor/skipped_steps": float(skipped),
            "actor/lr": backend.current_lr(),
        }
    )
    return summary


def micro_batch_rows(
    backend: PolicyUpdateBackend, batch: RolloutBatch, settings: UpdateSettings
) -> list[list[int]]:
    """The rows of `batch` (this rank's) in each micro-batch. Collective with a token budget: every
    DP rank must call it, and every rank gets the same number of micro-batches."""
    budget = settings.max_tokens_per_micro_batch
    if budget is None:
        size = settings.micro_batch_size
        return [list(range(start, min(start + size, len(batch)))) for start in range(0, len(batch), size)]
    lengths = row_lengths(batch)
    packed = settings.pack_sequences
    needed = torch.tensor([min_micro_batches(lengths, budget, packed)], dtype=torch.long)
    return plan_micro_batches(lengths, budget, int(backend.all_reduce(needed, "max").item()), packed)


def row_lengths(batch: RolloutBatch) -> list[RowLength]:
    """Each row's real prompt and response tokens."""
    return [
        RowLength(int(p), int(r))
        for p, r in zip(batch.prompt_mask.sum(1).tolist(), batch.response_mask.sum(1).tolist(), strict=True)
    ]


def logprobs_in_row_order(
    batch: RolloutBatch,
    plan: Sequence[Sequence[int]],
    forward: Callable[[list[RolloutBatch]], Iterable[torch.Tensor]],
) -> torch.Tensor:
    """`forward(trimmed micro-batches) -> one [b, r] tensor each` over the micro-batches of `plan`,
    each written back at its rows: [len(batch), R] float32 on the CPU in the batch's own row order,
    0 beyond a micro-batch's trimmed width. The values come back to the host in one transfer."""
    micros = [batch.select(list(rows)).trimmed() for rows in plan]
    values = [v.float() for v in forward(micros)]
    flat = torch.cat([v.reshape(-1) for v in values]).cpu() if values else torch.zeros(0)
    out = torch.zeros(len(batch), batch.response_ids.shape[1])
    for rows, part in zip(plan, flat.split([v.numel() for v in values]), strict=True):
        b, r = len(rows), part.numel() // max(1, len(rows))
        out[list(rows), :r] = part.reshape(b, r)
    return out


def _loss_fn(backend: PolicyUpdateBackend, algorithm: AlgorithmConfig, normalizer: LossNormalizer) -> LossFn:
    scale = backend.backward_scale

    def loss_fn(micro: RolloutBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None) -> MicroLoss:
        device = logprobs.device

        def on(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        assert micro.old_logprobs is not None and micro.advantages is not None, "compute_logprobs first"
        out = compute_policy_loss(
            algorithm,
            logprobs=logprobs,
            old_logprobs=micro.old_logprobs.to(device),
            advantages=micro.advantages.to(device),
            response_mask=micro.response_mask.to(device),
            normalizer=normalizer,
            rollout_logprobs=on(micro.rollout_logprobs),
            ref_logprobs=on(micro.ref_logprobs),
            # Without a bonus the entropy is only a diagnostic: keep it out of the graph.
            entropy=entropy if entropy is None or algorithm.entropy_bonus > 0 else entropy.detach(),
        )
        return MicroLoss(out.loss * scale if scale != 1.0 else out.loss, out.metrics)

    return loss_fn


def all_reduce_metrics(backend: PolicyUpdateBackend, metrics: dict[str, float]) -> dict[str, float]:
    """Per-rank minibatch metrics -> global ones: contributions are summed, `_max` names maxed.

    Every rank has the same names (they depend on the config only); sorted for a fixed order.
    """
    if backend.dp.size == 1:
        return metrics
    summed = sorted(k for k in metrics if not k.endswith("_max"))
    maxed = sorted(k for k in metrics if k.endswith("_max"))
    out: dict[str, float] = {}
    for names, op in ((summed, "sum"), (maxed, "max")):
        if names:
            reduced = backend.all_reduce(torch.tensor([metrics[k] for k in names], dtype=torch.float64), op)
            out.update(zip(names, reduced.tolist(), strict=True))
    return out


def mean_over_minibatches(dicts: list[dict[str, float]]) -> dict[str, float]:
    """A step's value of each metric: the mean over its optimizer steps (`_max`: the max)."""
    if not dicts:
        return {}
    return {
        k: (max(d[k] for d in dicts) if k.endswith("_max") else sum(d[k] for d in dicts) / len(dicts))
        for k in dicts[0]
    }
