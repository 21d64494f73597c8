import math

import pytest
import torch

from rlinf.algorithms import LossNormalizer, compute_policy_loss, logprob_mismatch_metrics, tis_weights
from rlinf.config.schema import AlgorithmConfig, RolloutISConfig

# Recomputed vs rollout probabilities per token: 0.5/0.25 -> weight 2 (capped at 1.5), 0.4/0.5 -> 0.8,
# 0.3/0.3 -> 1; the fourth slot is padding with a rollout logprob far below the recomputed one.
RECOMPUTED = torch.log(torch.tensor([[0.5, 0.4, 0.3, 0.9]], dtype=torch.float64))
ROLLOUT = torch.log(torch.tensor([[0.25, 0.5, 0.3, 1e-300]], dtype=torch.float64))
MASK = torch.tensor([[True, True, True, False]])


def test_mismatch_metrics_by_hand_ignore_padding() -> None:
    metrics = logprob_mismatch_metrics(ROLLOUT, RECOMPUTED, MASK)
    abs_diffs = [math.log(2), math.log(0.5 / 0.4), 0.0]
    assert metrics["rollout/logprob_abs_diff"] == pytest.approx(sum(abs_diffs) / 3)
    assert metrics["rollout/logprob_abs_diff_max"] == pytest.approx(math.log(2))


def test_mismatch_metrics_of_identical_logprobs_are_zero() -> None:
    metrics = logprob_mismatch_metrics(RECOMPUTED, RECOMPUTED.clone(), MASK)
    assert metrics == {"rollout/logprob_abs_diff": 0.0, "rollout/logprob_abs_diff_max": 0.0}


def test_token_tis_weights_are_capped_ratios_without_gradient() -> None:
    recomputed = RECOMPUTED.clone().requires_grad_()
    weights = tis_weights(recomputed, ROLLOUT, "token_tis", clip=1.5)
    assert weights is not None
    torch.testing.assert_close(weights[MASK], torch.tensor([1.5, 0.8, 1.0], dtype=torch.float64))
    assert not weights.requires_grad


def test_no_tis_mode_gives_no_weights() -> None:
    assert tis_weights(RECOMPUTED, ROLLOUT, "none", clip=1.5) is None


def test_unknown_tis_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="'seq_tis'.*none, token_tis"):
        tis_weights(RECOMPUTED, ROLLOUT, "seq_tis", clip=1.5)


def tis_loss(cfg: AlgorithmConfig, rollout_logprobs: torch.Tensor | None) -> tuple[float, dict[str, float]]:
    output = compute_policy_loss(
        cfg,
        logprobs=RECOMPUTED,  # on-policy w.r.t. the actor: ratio 1, token loss -A
        old_logprobs=RECOMPUTED,
        advantages=torch.ones(1, dtype=torch.float64),
        response_mask=MASK,
        normalizer=LossNormalizer.from_masks([MASK]),
        rollout_logprobs=rollout_logprobs,
    )
    return output.loss.item(), {k: v.item() for k, v in output.metrics.items()}


def test_token_tis_reweights_each_token_of_the_policy_loss() -> None:
    cfg = AlgorithmConfig(rollout_is=RolloutISConfig(mode="token_tis", clip=1.5))
    loss, metrics = tis_loss(cfg, ROLLOUT)
    assert loss == pytest.approx(-(1.5 + 0.8 + 1.0) / 3)
    assert metrics["actor/tis_weight_mean"] == pytest.approx((1.5 + 0.8 + 1.0) / 3)
    assert metrics["actor/tis_clip_fraction"] == pytest.approx(1 / 3)


def test_without_tis_rollout_logprobs_do_not_change_the_loss() -> None:
    loss, metrics = tis_loss(AlgorithmConfig(), ROLLOUT)
    assert loss == pytest.approx(-1.0)
    assert "actor/tis_weight_mean" not in metrics and "actor/tis_clip_fraction" not in metrics


def test_token_tis_needs_rollout_logprobs() -> None:
    cfg = AlgorithmConfig(rollout_is=RolloutISConfig(mode="token_tis"))
    with pytest.raises(ValueError, match="token_tis.*needs rollout_logprobs"):
        tis_loss(cfg, None)
