import math

import pytest
import torch

from rlinf.algorithms import POLICY_LOSSES, LossNormalizer, LossOutput, compute_policy_loss
from rlinf.config.schema import AlgorithmConfig

# One sequence, five response tokens and one padded slot holding a garbage logprob whose ratio
# would overflow exp(). Each token exercises one branch of the clipped surrogate
# (ratio_clip_eps = 0.2, clip_ratio_high = 0.28):
#   t0  A=+1 ratio 1.5 -> clipped high: -1.28      t1  A=-1 ratio 0.5 -> clipped low: 0.8
#   t2  A=+1 ratio 0.5 -> unclipped: -0.5          t3  A=-1 ratio 1.5 -> unclipped: 1.5
#   t4  A=-2 ratio 4.0 -> unclipped 8.0, or 6.0 = -A * clip_ratio_c under dual clip with c = 3
RATIOS = [1.5, 0.5, 0.5, 1.5, 4.0]
TOKEN_ADVANTAGES = [1.0, -1.0, 1.0, -1.0, -2.0]
OLD = torch.log(torch.tensor([[0.3, 0.2, 0.6, 0.1, 0.05, 0.5]], dtype=torch.float64))
MASK = torch.tensor([[True, True, True, True, True, False]])
NORMALIZER = LossNormalizer.from_masks([MASK])
CFG = AlgorithmConfig(ratio_clip_eps=0.2, clip_ratio_high=0.28)


def new_logprobs() -> torch.Tensor:
    log_ratio = torch.log(torch.tensor([[*RATIOS, 1.0]], dtype=torch.float64))
    logprobs = OLD + log_ratio
    logprobs[0, 5] = 1e4  # padding garbage: exp(1e4 - old) is inf
    return logprobs.requires_grad_()


def loss_of(
    cfg: AlgorithmConfig, logprobs: torch.Tensor, advantages: torch.Tensor | None = None
) -> LossOutput:
    if advantages is None:
        advantages = torch.tensor([[*TOKEN_ADVANTAGES, 0.0]], dtype=torch.float64)
    return compute_policy_loss(
        cfg,
        logprobs=logprobs,
        old_logprobs=OLD,
        advantages=advantages,
        response_mask=MASK,
        normalizer=NORMALIZER,
    )


def test_clipped_surrogate_by_hand() -> None:
    logprobs = new_logprobs()
    output = loss_of(CFG, logprobs)
    assert output.loss.item() == pytest.approx((-1.28 + 0.8 - 0.5 + 1.5 + 8.0) / 5)
    output.loss.backward()
    assert logprobs.grad is not None
    # d/dlogp of -A * ratio / 5 is -A * ratio / 5 on unclipped tokens; clipped tokens get none,
    # and the padded slot's inf ratio leaves no NaN behind.
    expected = torch.tensor([[0.0, 0.0, -0.5 / 5, 1.5 / 5, 8.0 / 5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logprobs.grad, expected)


def test_clip_metrics_by_hand() -> None:
    metrics = loss_of(CFG, new_logprobs()).metrics
    assert metrics["actor/clip_fraction_low"].item() == pytest.approx(1 / 5)
    assert metrics["actor/clip_fraction_high"].item() == pytest.approx(1 / 5)
    assert metrics["actor/ratio_mean"].item() == pytest.approx(sum(RATIOS) / 5)
    assert metrics["actor/ratio_max"].item() == pytest.approx(4.0)
    k3_old_to_new = sum(r - 1 - math.log(r) for r in RATIOS) / 5
    assert metrics["actor/approx_kl"].item() == pytest.approx(k3_old_to_new)
    assert metrics["actor/policy_loss"].item() == pytest.approx(8.52 / 5)
    assert metrics["actor/loss"].item() == pytest.approx(8.52 / 5)
    assert "actor/dual_clip_fraction" not in metrics and "actor/kl_loss" not in metrics
    assert all(m.dim() == 0 and not m.requires_grad for m in metrics.values())


def test_dual_clip_bounds_negative_advantage_tokens() -> None:
    logprobs = new_logprobs()
    output = loss_of(AlgorithmConfig(ratio_clip_eps=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0), logprobs)
    assert output.loss.item() == pytest.approx((-1.28 + 0.8 - 0.5 + 1.5 + 6.0) / 5)
    assert output.metrics["actor/dual_clip_fraction"].item() == pytest.approx(1 / 5)
    output.loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0, 4].item() == 0.0  # the dual bound is constant in the ratio
    assert logprobs.grad[0, 3].item() == pytest.approx(1.5 / 5)  # ratio 1.5 < c: untouched


def test_dual_clip_must_exceed_one() -> None:
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        loss_of(AlgorithmConfig(clip_ratio_c=0.9), new_logprobs())


@pytest.mark.parametrize(
    ("advantage", "ratio", "clip_low", "clip_high", "expected"),
    [
        (1.0, 1.25, 0.2, 0.28, -1.25),  # within the wider upper bound
        (1.0, 1.25, 0.2, 0.20, -1.20),  # clipped by the narrower one
        (-1.0, 0.75, 0.2, 0.28, 0.80),  # clipped at 1 - 0.2
        (-1.0, 0.75, 0.3, 0.28, 0.75),  # within 1 - 0.3
    ],
)
def test_lower_and_upper_clip_bounds_are_independent(
    advantage: float, ratio: float, clip_low: float, clip_high: float, expected: float
) -> None:
    cfg = AlgorithmConfig(ratio_clip_eps=clip_low, clip_ratio_high=clip_high)
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    output = compute_policy_loss(
        cfg,
        logprobs=old + math.log(ratio),
        old_logprobs=old,
        advantages=torch.tensor([advantage], dtype=torch.float64),
        response_mask=torch.tensor([[True]]),
        normalizer=LossNormalizer(1.0, 1.0),
    )
    assert output.loss.item() == pytest.approx(expected)


def test_sequence_advantages_broadcast_over_tokens() -> None:
    per_sequence = torch.tensor([-0.7], dtype=torch.float64)
    broadcast = loss_of(CFG, new_logprobs(), per_sequence)
    explicit = loss_of(CFG, new_logprobs(), per_sequence.expand(1, 6))
    torch.testing.assert_close(broadcast.loss, explicit.loss)
    assert broadcast.loss.item() == pytest.approx(0.7 * (1.5 + 0.8 + 0.8 + 1.5 + 4.0) / 5)


def test_on_policy_loss_is_minus_mean_advantage_with_its_gradient() -> None:
    # ratio 1 everywhere: the PPO loss reduces to the vanilla policy gradient -A * logp.
    logprobs = OLD.clone().requires_grad_()
    advantages = torch.tensor([[0.5, -1.0, 2.0, 0.0, 1.5, 9.0]], dtype=torch.float64)
    output = loss_of(CFG, logprobs, advantages)
    assert output.loss.item() == pytest.approx(-(0.5 - 1.0 + 2.0 + 0.0 + 1.5) / 5)
    output.loss.backward()
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, -advantages * MASK / 5)


def test_entropy_bonus_is_subtracted_and_differentiable() -> None:
    entropy = torch.tensor([[1.0, 2.0, 0.5, 0.5, 1.0, 99.0]], dtype=torch.float64, requires_grad=True)
    cfg = AlgorithmConfig(entropy_bonus=0.01)
    output = compute_policy_loss(
        cfg,
        logprobs=OLD,
        old_logprobs=OLD,
        advantages=torch.zeros(1, dtype=torch.float64),
        response_mask=MASK,
        normalizer=NORMALIZER,
        entropy=entropy,
    )
    assert output.loss.item() == pytest.approx(-0.01 * 5.0 / 5)
    assert output.metrics["actor/entropy"].item() == pytest.approx(1.0)
    output.loss.backward()
    assert entropy.grad is not None
    torch.testing.assert_close(entropy.grad, -0.01 * MASK.double() / 5)


def test_entropy_without_bonus_is_only_logged() -> None:
    entropy = torch.full((1, 6), 2.0, dtype=torch.float64)
    with_entropy = compute_policy_loss(
        CFG,
        logprobs=new_logprobs(),
        old_logprobs=OLD,
        advantages=torch.tensor([[*TOKEN_ADVANTAGES, 0.0]], dtype=torch.float64),
        response_mask=MASK,
        normalizer=NORMALIZER,
        entropy=entropy,
    )
    assert with_entropy.loss.item() == pytest.approx(loss_of(CFG, new_logprobs()).loss.item())
    assert with_entropy.metrics["actor/entropy"].item() == pytest.approx(2.0)


def test_entropy_bonus_needs_entropy() -> None:
    with pytest.raises(ValueError, match="entropy_bonus=0.01 needs the per-token entropy"):
        loss_of(AlgorithmConfig(entropy_bonus=0.01), new_logprobs())


def test_unknown_loss_type_names_the_valid_ones() -> None:
    assert POLICY_LOSSES.names() == ("actor",)
    with pytest.raises(ValueError, match="'critic'.*valid names: actor"):
        loss_of(AlgorithmConfig(loss_type="critic"), new_logprobs())
