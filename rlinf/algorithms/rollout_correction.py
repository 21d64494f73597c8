"""Rollout/trainer mismatch: how far the rollout engine's logprobs are from the actor's, and
truncated importance sampling (`algorithm.rollout_is`) to correct the policy gradient for it.

The rollout engine (SGLang kernels, bf16, batch-dependent numerics) samples from a policy that is
slightly off the one the actor trains; the recomputed actor logprobs are the trainer's view.
"""

from __future__ import annotations

import torch

from rlinf.algorithms.utils import masked_max, masked_mean

TIS_MODES = ("none", "token_tis")


def logprob_mismatch_metrics(
    rollout_logprobs: torch.Tensor, recomputed_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Masked mean and max of |rollout - recomputed| logprob over the response tokens [B, R]."""
    abs_diff = (rollout_logprobs - recomputed_logprobs).abs()
    return {
        "rollout/logprob_abs_diff": float(masked_mean(abs_diff, mask)),
        "rollout/logprob_abs_diff_max": float(masked_max(abs_diff, mask)),
    }


def tis_weights(
    recomputed_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mode: str, clip: float
) -> torch.Tensor | None:
    """Per-token importance weights pi_actor / pi_rollout, or None when `mode` is "none".

    token_tis: min(exp(recomputed - rollout), clip), detached. The cap bounds the variance a few
    tokens the rollout found very unlikely would add; the weights are constants of the loss.
    """
    if mode == "none":
        return None
    if mode == "token_tis":
        return (recomputed_logprobs - rollout_logprobs).detach().exp().clamp(max=clip)
    raise ValueError(f"unknown rollout_is mode {mode!r}; valid modes: {', '.join(TIS_MODES)}")
