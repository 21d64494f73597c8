import math

import pytest
import torch

from rlinf.algorithms import ADVANTAGES, compute_advantages

# Four groups with interleaved rows:
#   group 3 -> rows 0, 3, 7 with rewards 1, 0, 2  (mean 1, sample std 1)
#   group 9 -> rows 1, 4    with rewards 4, 0     (mean 2, sample std 2*sqrt(2))
#   group 5 -> rows 2, 5, 8 with rewards 0.1 x3   (all equal; the float64 mean is 0.1 + 1 ulp)
#   group 11 -> row 6       with reward 3         (singleton)
GROUP_INDEX = torch.tensor([3, 9, 5, 3, 9, 5, 11, 3, 5])
REWARDS = torch.tensor([1.0, 4.0, 0.1, 0.0, 0.0, 0.1, 3.0, 2.0, 0.1], dtype=torch.float64)
EPS = 1e-6


def advantages_of(adv_type: str) -> torch.Tensor:
    return compute_advantages(adv_type, REWARDS, GROUP_INDEX, eps=EPS).advantages


def test_grpo_divides_by_bessel_corrected_group_std() -> None:
    s = 2 / (2 * math.sqrt(2) + EPS)  # group 9: deviation 2 over std 2*sqrt(2)
    expected = [0.0, s, 0.0, -1 / (1 + EPS), -s, 0.0, 0.0, 1 / (1 + EPS), 0.0]
    torch.testing.assert_close(advantages_of("grpo"), torch.tensor(expected, dtype=torch.float64))


def test_dr_grpo_subtracts_group_mean_only() -> None:
    expected = [0.0, 2.0, 0.0, -1.0, -2.0, 0.0, 0.0, 1.0, 0.0]
    torch.testing.assert_close(advantages_of("dr_grpo"), torch.tensor(expected, dtype=torch.float64))


def test_rloo_subtracts_mean_of_the_other_members() -> None:
    # group 3: 1 - (0+2)/2, 0 - (1+2)/2, 2 - (1+0)/2; group 9: 4 - 0, 0 - 4
    expected = [0.0, 4.0, 0.0, -1.5, -4.0, 0.0, 0.0, 1.5, 0.0]
    torch.testing.assert_close(advantages_of("rloo"), torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("adv_type", ["grpo", "dr_grpo", "rloo"])
def test_equal_reward_groups_are_exactly_zero_and_counted(adv_type: str) -> None:
    result = compute_advantages(adv_type, REWARDS, GROUP_INDEX, eps=EPS)
    assert result.advantages[[2, 5, 8, 6]].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert result.metrics["advantages/zero_std_groups"] == 2.0
    assert result.metrics["advantages/zero_std_fraction"] == 0.5


@pytest.mark.parametrize("adv_type", ["grpo", "dr_grpo", "rloo"])
def test_advantages_follow_rows_not_their_order(adv_type: str) -> None:
    permutation = torch.randperm(len(REWARDS), generator=torch.Generator().manual_seed(0))
    shuffled = compute_advantages(adv_type, REWARDS[permutation], GROUP_INDEX[permutation], eps=EPS)
    torch.testing.assert_close(shuffled.advantages, advantages_of(adv_type)[permutation])


@pytest.mark.parametrize("adv_type", ["grpo", "dr_grpo", "rloo"])
def test_every_group_has_zero_mean_advantage(adv_type: str) -> None:
    rewards = torch.randn(24, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    groups = torch.arange(6).repeat(4)
    advantages = compute_advantages(adv_type, rewards, groups).advantages
    group_sums = torch.zeros(6, dtype=torch.float64).index_add(0, groups, advantages)
    torch.testing.assert_close(group_sums, torch.zeros(6, dtype=torch.float64))


def test_normalize_whitens_over_the_whole_batch() -> None:
    # dr_grpo gives [0, 2, 0, -1, -2, 0, 0, 1, 0]: mean 0, sample std sqrt(10 / 8)
    result = compute_advantages("dr_grpo", REWARDS, GROUP_INDEX, eps=EPS, normalize=True)
    raw = torch.tensor([0.0, 2.0, 0.0, -1.0, -2.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(result.advantages, raw / (math.sqrt(1.25) + EPS))
    assert result.metrics["advantages/std"] == pytest.approx(math.sqrt(1.25) / (math.sqrt(1.25) + EPS))
    assert result.metrics["advantages/mean"] == pytest.approx(0.0, abs=1e-12)


def test_summary_metrics_describe_the_advantages() -> None:
    metrics = compute_advantages("rloo", REWARDS, GROUP_INDEX, eps=EPS).metrics
    assert metrics["advantages/max"] == 4.0
    assert metrics["advantages/min"] == -4.0
    assert metrics["advantages/mean"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["advantages/std"] == pytest.approx(math.sqrt((16 + 2.25) * 2 / 8))


def test_float32_rewards_give_float32_advantages() -> None:
    result = compute_advantages("grpo", REWARDS.float(), GROUP_INDEX)
    assert result.advantages.dtype == torch.float32
    torch.testing.assert_close(result.advantages, advantages_of("grpo").float(), atol=1e-5, rtol=1e-5)


def test_unknown_estimator_names_the_valid_ones() -> None:
    assert ADVANTAGES.names() == ("dr_grpo", "grpo", "rloo")
    with pytest.raises(ValueError, match="unknown advantage estimator .*'ppo'.*dr_grpo, grpo, rloo"):
        compute_advantages("ppo", REWARDS, GROUP_INDEX)


def test_mismatched_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="group_index"):
        compute_advantages("grpo", REWARDS, GROUP_INDEX[:-1])


def test_registering_a_name_twice_fails() -> None:
    with pytest.raises(ValueError, match="already registered"):
        ADVANTAGES.register("grpo")(lambda rewards, groups, eps: rewards)
