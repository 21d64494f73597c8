"""The actor's loss for one micro-batch: policy gradient, KL to a reference, entropy bonus.

`compute_policy_loss` returns a contribution normalised by minibatch-global counts, and so do its
metrics; see rlinf.algorithms.aggregation for why and how the caller combines micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlinf.algorithms.aggregation import LossNormalizer, aggregate
from rlinf.algorithms.kl import kl_penalty
from rlinf.algorithms.registry import Registry
from rlinf.algorithms.rollout_correction import tis_weights
from rlinf.algorithms.utils import masked_max
from rlinf.config.schema import AlgorithmConfig


@dataclass(frozen=True)
class TokenPolicyLoss:
    loss: torch.Tensor  # [b, R] per-token policy-gradient loss
    indicators: dict[str, torch.Tensor]  # metric name -> [b, R] 0/1 per token; logged as a token mean


PolicyLossFn = Callable[[AlgorithmConfig, torch.Tensor, torch.Tensor], TokenPolicyLoss]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss (algorithm.loss_type)")


@POLICY_LOSSES.register("actor")
def ppo_clipped_loss(cfg: AlgorithmConfig, ratio: torch.Tensor, advantages: torch.Tensor) -> TokenPolicyLoss:
    """PPO clipped surrogate with asymmetric clip bounds and optional dual clip, per token.

    loss = max(-A * ratio, -A * clamp(ratio, 1 - ratio_clip_eps, 1 + clip_ratio_high)); with
    `clip_ratio_c` set, tokens with A < 0 take min(loss, -A * clip_ratio_c), which bounds how hard
    a single very-off-policy token with a negative advantage can push.

    Indicators mark tokens whose clip is active (their gradient is zero):
    clip_fraction_low: A < 0 and ratio < 1 - ratio_clip_eps; clip_fraction_high: A > 0 and
    ratio > 1 + clip_ratio_high; dual_clip_fraction: A < 0 and the dual bound is the minimum.
    """
    low, high = 1 - cfg.ratio_clip_eps, 1 + cfg.clip_ratio_high
    loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(low, high))
    indicators = {
        "actor/clip_fraction_low": (advantages < 0) & (ratio < low),
        "actor/clip_fraction_high": (advantages > 0) & (ratio > high),
    }
    if cfg.clip_ratio_c is not None:
        if cfg.clip_ratio_c <= 1:
            raise ValueError(f"algorithm.clip_ratio_c must be > 1 (or null); got {cfg.clip_ratio_c}")
        dual_bound = -advantages * cfg.clip_ratio_c
        negative = advantages < 0
        indicators["actor/dual_clip_fraction"] = negative & (loss > dual_bound)
        loss = torch.where(negative, torch.minimum(loss, dual_bound), loss)
    return TokenPolicyLoss(loss, {name: hit.to(loss.dtype) for name, hit in indicators.items()})


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable: this micro-batch's contribution
    metrics: dict[str, torch.Tensor]  # 0-dim, detached; combine micro-batches with reduce_metrics


def compute_policy_loss(
    cfg: AlgorithmConfig,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    normalizer: LossNormalizer,
    rollout_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> LossOutput:
    """Loss of one micro-batch: aggregate(pg * tis) + kl_beta * aggregate(kl) - entropy_bonus * aggregate(H).

    Shapes: logprobs, old_logprobs, response_mask [b, R]; advantages [b] (broadcast over tokens)
    or [b, R]; rollout_logprobs, ref_logprobs, entropy [b, R] or None. Aggregation follows
    `cfg.loss_agg_func`.

    - ref_logprobs is read only when kl_beta > 0 (then it is required); otherwise no KL work is done.
    - rollout_logprobs is required when cfg.rollout_is.mode is not "none"; the TIS weights come
      from old_logprobs (the actor's recomputation) against them.
    - entropy is required when entropy_bonus > 0; given with a zero bonus it is only logged.

    The loss terms (`actor/policy_loss`, `actor/kl_loss`, `actor/loss`) follow loss_agg_func; the
    diagnostics are token means whatever loss_agg_func is.
    """
    mask = response_mask
    # Padded slots may hold arbitrary logprobs; a zero log-ratio there keeps exp() finite, so the
    # masked-out branch cannot send NaN (0 * inf) back through the gradient.
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = log_ratio.exp()
    token_advantages = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    policy = POLICY_LOSSES.get(cfg.loss_type)(cfg, ratio, token_advantages.expand_as(ratio))

    def token_mean(values: torch.Tensor) -> torch.Tensor:
        return aggregate(values.detach(), mask, "token-mean", normalizer)

    metrics = {name: token_mean(hit) for name, hit in policy.indicators.items()}
    metrics["actor/ratio_mean"] = token_mean(ratio)
    metrics["actor/ratio_max"] = masked_max(ratio.detach(), mask)
    # k3 with the roles swapped: the tokens were sampled from pi_old, so this estimates KL(pi_old || pi).
    metrics["actor/approx_kl"] = token_mean(kl_penalty(-log_ratio, "k3"))

    token_loss = policy.loss
    if rollout_logprobs is None:
        if cfg.rollout_is.mode != "none":
            raise ValueError(f"rollout_is.mode={cfg.rollout_is.mode!r} needs rollout_logprobs")
        weights = None
    else:
        weights = tis_weights(old_logprobs, rollout_logprobs, cfg.rollout_is.mode, cfg.rollout_is.clip)
    if weights is not None:
        token_loss = token_loss * weights
        metrics["actor/tis_weight_mean"] = token_mean(weights)
        metrics["actor/tis_clip_fraction"] = token_mean((weights >= cfg.rollout_is.clip).to(weights.dtype))

    policy_loss = aggregate(token_loss, mask, cfg.loss_agg_func, normalizer)
    metrics["actor/policy_loss"] = policy_loss.detach()
    loss = policy_loss

    if cfg.kl_beta > 0:
        if ref_logprobs is None:
            raise ValueError(f"kl_beta={cfg.kl_beta} needs ref_logprobs")
        ref_log_ratio = torch.where(mask, logprobs - ref_logprobs, torch.zeros_like(logprobs))
        kl_loss = aggregate(
            kl_penalty(ref_log_ratio, cfg.kl_penalty_type), mask, cfg.loss_agg_func, normalizer
        )
        metrics["actor/kl_loss"] = kl_loss.detach()
        loss = loss + cfg.kl_beta * kl_loss

    if cfg.entropy_bonus > 0 and entropy is None:
        raise ValueError(f"entropy_bonus={cfg.entropy_bonus} needs the per-token entropy")
    if entropy is not None:
        metrics["actor/entropy"] = token_mean(entropy)
        if cfg.entropy_bonus > 0:
            loss = loss - cfg.entropy_bonus * aggregate(entropy, mask, cfg.loss_agg_func, normalizer)

    metrics["actor/loss"] = loss.detach()
    return LossOutput(loss, metrics)
