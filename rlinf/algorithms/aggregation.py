"""Loss aggregation over response tokens (`algorithm.loss_agg_func`) and the metric convention.

A minibatch (the data of one optimizer step) is spread over data-parallel ranks and, on each rank,
split into micro-batches. Every loss and metric computed in rlinf.algorithms is a micro-batch's
*contribution*: a sum over its tokens (or sequences) divided by a count over the WHOLE minibatch,
carried by `LossNormalizer`. Consequently:

- the minibatch loss is the sum of the micro-batch losses, so calling backward on each micro-batch
  loss accumulates exactly the minibatch gradient, however the minibatch was split;
- a metric's minibatch value is the sum of its micro-batch contributions, except for names ending
  in `_max`, which are maxima and reduce with max. `reduce_metrics` implements this rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from rlinf.algorithms.registry import Registry
from rlinf.algorithms.utils import masked_sum


@dataclass(frozen=True)
class LossNormalizer:
    """Counts over the whole minibatch, on all data-parallel ranks.

    The caller computes them once before its micro-batch loop (all-reducing across DP ranks);
    `from_masks` does it for a single process. A sequence counts when it has at least one
    response token.
    """

    num_tokens: float
    num_sequences: float

    def __post_init__(self) -> None:
        if self.num_tokens <= 0 or self.num_sequences <= 0:
            raise ValueError(
                f"a minibatch needs response tokens to train on; got num_tokens={self.num_tokens}, "
                f"num_sequences={self.num_sequences}"
            )

    @classmethod
    def from_masks(
        cls, masks: Sequence[torch.Tensor], all_reduce_sum: AllReduceSum | None = None
    ) -> LossNormalizer:
        """Counts over the [b, R] response masks of every micro-batch of one minibatch.

        With data parallelism each rank passes the masks of ITS part of the minibatch and an
        `all_reduce_sum` that sums a float64 tensor over the data-parallel ranks; every rank then
        holds the same global counts. Without it the counts are this process's only.
        """
        local = torch.tensor(
            [
                float(sum(int(mask.sum()) for mask in masks)),
                float(sum(int(mask.any(dim=-1).sum()) for mask in masks)),
            ],
            dtype=torch.float64,
        )
        counts = local if all_reduce_sum is None else all_reduce_sum(local)
        return cls(num_tokens=float(counts[0]), num_sequences=float(counts[1]))


AllReduceSum = Callable[[torch.Tensor], torch.Tensor]


AggregationFn = Callable[[torch.Tensor, torch.Tensor, LossNormalizer], torch.Tensor]
LOSS_AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation (algorithm.loss_agg_func)")


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(values: torch.Tensor, mask: torch.Tensor, normalizer: LossNormalizer) -> torch.Tensor:
    """Every response token of the minibatch weighs the same; long answers weigh more."""
    return masked_sum(values, mask) / normalizer.num_tokens


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, normalizer: LossNormalizer) -> torch.Tensor:
    """Mean over tokens within each sequence, then every sequence weighs the same."""
    per_sequence = _per_sequence_sum(values, mask) / mask.sum(dim=-1).clamp(min=1)
    return per_sequence.sum() / normalizer.num_sequences


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(values: torch.Tensor, mask: torch.Tensor, normalizer: LossNormalizer) -> torch.Tensor:
    """Sum over tokens within each sequence, then mean over sequences."""
    return _per_sequence_sum(values, mask).sum() / normalizer.num_sequences


def _per_sequence_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, values, torch.zeros_like(values)).sum(dim=-1)


def aggregate(values: torch.Tensor, mask: torch.Tensor, agg: str, normalizer: LossNormalizer) -> torch.Tensor:
    """This micro-batch's contribution to the minibatch aggregate of per-token `values` [b, R].

    `mask` [b, R] bool marks response tokens; `normalizer` holds minibatch-global counts, so
    summing the results of all micro-batches gives the aggregate over the whole minibatch.

    With data parallelism each rank backpropagates its own micro-batches and DDP (or Megatron's
    gradient reduction) then AVERAGES the gradients over the dp_size ranks, while this convention
    needs their SUM. The actor therefore multiplies each micro-batch loss by dp_size before
    backward; that is the actor's job, not this function's.
    """
    return LOSS_AGGREGATIONS.get(agg)(values, mask, normalizer)


def reduce_metrics(metrics: Iterable[Mapping[str, torch.Tensor | float]]) -> dict[str, float]:
    """Combine per-micro-batch (and per-rank) metric dicts into minibatch values.

    Each value is a contribution normalised by minibatch-global counts, so values are summed;
    names ending in `_max` are maxima and reduce with max. A name missing from some dicts is
    reduced over the dicts that have it.
    """
    reduced: dict[str, float] = {}
    for metric_dict in metrics:
        for name, value in metric_dict.items():
            number = float(value)
            if name not in reduced:
                reduced[name] = number
            elif name.endswith("_max"):
                reduced[name] = max(reduced[name], number)
            else:
                reduced[name] += number
    return reduced
