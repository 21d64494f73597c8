"""Per-token KL estimators (`algorithm.kl_penalty_type`) between the policy and a reference.

Each takes `log_ratio` = log pi(y) - log pi_ref(y) for tokens y sampled from (roughly) pi, and
estimates KL(pi || pi_ref) at that token (Schulman's k1, k2, k3 estimators).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlinf.algorithms.registry import Registry

KLFn = Callable[[torch.Tensor], torch.Tensor]
KL_PENALTIES: Registry[KLFn] = Registry("KL penalty (algorithm.kl_penalty_type)")

LOW_VAR_KL_BOUND = 10.0
# k3 already exceeds LOW_VAR_KL_BOUND once |log_ratio| > 12, so clamping the log-ratio here leaves
# every low_var_kl value unchanged; it only keeps exp() finite, so the clamp's zero gradient is not
# turned into NaN (0 * inf) on the way back.
_LOW_VAR_LOG_RATIO_BOUND = 20.0


@KL_PENALTIES.register("k1")
def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """log(pi / pi_ref): unbiased, high variance, can be negative."""
    return log_ratio


@KL_PENALTIES.register("k2")
def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """0.5 * log(pi / pi_ref)^2: biased, low variance, never negative."""
    return 0.5 * log_ratio.square()


@KL_PENALTIES.register("k3")
def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """pi_ref/pi - log(pi_ref/pi) - 1: unbiased and never negative."""
    reference_log_ratio = -log_ratio
    return reference_log_ratio.exp() - reference_log_ratio - 1


@KL_PENALTIES.register("low_var_kl")
def low_var_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 clamped to [-10, 10], so one token far off the reference cannot dominate the loss."""
    bounded = log_ratio.clamp(-_LOW_VAR_LOG_RATIO_BOUND, _LOW_VAR_LOG_RATIO_BOUND)
    return k3(bounded).clamp(-LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)


def kl_penalty(log_ratio: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of `kind` for `log_ratio` = logprobs - ref_logprobs."""
    return KL_PENALTIES.get(kind)(log_ratio)
