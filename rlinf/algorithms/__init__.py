"""GRPO maths as pure functions, selected by name from registries keyed by the recipe's fields."""

from rlinf.algorithms.advantages import ADVANTAGES, AdvantageResult, compute_advantages
from rlinf.algorithms.aggregation import LOSS_AGGREGATIONS, LossNormalizer, aggregate, reduce_metrics
from rlinf.algorithms.early_stop import should_early_stop
from rlinf.algorithms.entropy import entropy_from_logits
from rlinf.algorithms.kl import KL_PENALTIES, kl_penalty
from rlinf.algorithms.policy_loss import POLICY_LOSSES, LossOutput, compute_policy_loss
from rlinf.algorithms.registry import Registry
from rlinf.algorithms.rollout_correction import TIS_MODES, logprob_mismatch_metrics, tis_weights

__all__ = [
    "ADVANTAGES",
    "KL_PENALTIES",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "TIS_MODES",
    "AdvantageResult",
    "LossNormalizer",
    "LossOutput",
    "Registry",
    "aggregate",
    "compute_advantages",
    "compute_policy_loss",
    "entropy_from_logits",
    "kl_penalty",
    "logprob_mismatch_metrics",
    "reduce_metrics",
    "should_early_stop",
    "tis_weights",
]
