import math

import pytest
import torch

from rlinf.algorithms import (
    KL_PENALTIES,
    LossNormalizer,
    compute_policy_loss,
    entropy_from_logits,
    kl_penalty,
)
from rlinf.config.schema import AlgorithmConfig

LOG2 = math.log(2)
# Two tokens: pi = 0.5 vs pi_ref = 0.25 (log-ratio +log 2), and pi = 0.25 vs pi_ref = 0.5 (-log 2).
LOGPROBS = torch.log(torch.tensor([[0.5, 0.25, 0.9]], dtype=torch.float64))
REF_LOGPROBS = torch.log(torch.tensor([[0.25, 0.5, 1e-300]], dtype=torch.float64))  # last slot is padding
MASK = torch.tensor([[True, True, False]])
HAND_KL = {
    "k1": (LOG2, -LOG2),
    "k2": (0.5 * LOG2**2, 0.5 * LOG2**2),
    "k3": (0.5 + LOG2 - 1, 2 - LOG2 - 1),  # pi_ref/pi - log(pi_ref/pi) - 1
    "low_var_kl": (0.5 + LOG2 - 1, 2 - LOG2 - 1),
}


@pytest.mark.parametrize("kind", sorted(HAND_KL))
def test_kl_estimators_by_hand(kind: str) -> None:
    values = kl_penalty(torch.tensor([LOG2, -LOG2], dtype=torch.float64), kind)
    torch.testing.assert_close(values, torch.tensor(HAND_KL[kind], dtype=torch.float64))


def test_low_var_kl_clamps_k3_at_ten_with_finite_gradients() -> None:
    log_ratio = torch.tensor([30.0, -30.0, -100.0, 0.0], requires_grad=True)  # exp(100) is inf in float32
    values = kl_penalty(log_ratio, "low_var_kl")
    assert values.tolist() == [10.0, 10.0, 10.0, 0.0]
    assert kl_penalty(torch.tensor([30.0]), "k3").item() == pytest.approx(29.0)  # unclamped k3 for contrast
    values.sum().backward()
    assert log_ratio.grad is not None
    assert log_ratio.grad.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_kl_estimators_agree_with_the_exact_kl_in_expectation() -> None:
    # Sampling y ~ pi over three outcomes, k1 and k3 are unbiased estimators of KL(pi || ref).
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    exact = float((pi * (pi / ref).log()).sum())
    log_ratio = (pi / ref).log()
    for kind in ("k1", "k3", "low_var_kl"):
        assert float((pi * kl_penalty(log_ratio, kind)).sum()) == pytest.approx(exact), kind


def loss_with_reference(cfg: AlgorithmConfig, ref_logprobs: torch.Tensor | None) -> dict[str, float]:
    output = compute_policy_loss(
        cfg,
        logprobs=LOGPROBS,
        old_logprobs=LOGPROBS,
        advantages=torch.zeros(1, dtype=torch.float64),  # isolates the KL term
        response_mask=MASK,
        normalizer=LossNormalizer.from_masks([MASK]),
        ref_logprobs=ref_logprobs,
    )
    return {"loss": output.loss.item(), **{k: v.item() for k, v in output.metrics.items()}}


@pytest.mark.parametrize("kind", sorted(HAND_KL))
def test_kl_term_in_the_policy_loss(kind: str) -> None:
    result = loss_with_reference(AlgorithmConfig(kl_beta=0.1, kl_penalty_type=kind), REF_LOGPROBS)
    mean_kl = sum(HAND_KL[kind]) / 2
    assert result["actor/kl_loss"] == pytest.approx(mean_kl)
    assert result["loss"] == pytest.approx(0.1 * mean_kl)


def test_zero_kl_beta_never_reads_the_reference() -> None:
    without_reference = loss_with_reference(AlgorithmConfig(kl_beta=0.0), None)
    poisoned_reference = loss_with_reference(
        AlgorithmConfig(kl_beta=0.0), torch.full_like(LOGPROBS, math.nan)
    )
    assert "actor/kl_loss" not in without_reference
    assert without_reference == poisoned_reference
    assert without_reference["loss"] == 0.0


def test_positive_kl_beta_needs_the_reference() -> None:
    with pytest.raises(ValueError, match="kl_beta=0.1 needs ref_logprobs"):
        loss_with_reference(AlgorithmConfig(kl_beta=0.1), None)


def test_unknown_kl_type_names_the_valid_ones() -> None:
    assert KL_PENALTIES.names() == ("k1", "k2", "k3", "low_var_kl")
    with pytest.raises(ValueError, match="'k4'.*k1, k2, k3, low_var_kl"):
        loss_with_reference(AlgorithmConfig(kl_beta=0.1, kl_penalty_type="k4"), REF_LOGPROBS)


def test_entropy_matches_an_independent_reference() -> None:
    logits = torch.randn(2, 3, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), expected)


def test_entropy_of_uniform_and_of_one_hot_distributions() -> None:
    assert entropy_from_logits(torch.zeros(7)).item() == pytest.approx(math.log(7))
    torch.testing.assert_close(entropy_from_logits(torch.full((2, 5), 123.0)), torch.full((2,), math.log(5)))
    assert entropy_from_logits(torch.tensor([0.0, 1e4, -1e4])).item() == pytest.approx(0.0, abs=1e-6)


def test_entropy_is_stable_for_extreme_float32_logits() -> None:
    # -sum(p * log(p)) gives 0 * -inf = NaN here: softmax rounds exp(-2e4) to 0.
    logits = torch.tensor([[1e4, -1e4, 0.0, 5.0]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    entropy.sum().backward()
    assert torch.isfinite(entropy).all()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
