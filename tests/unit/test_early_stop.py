import pytest

from rlinf.algorithms import should_early_stop


@pytest.mark.parametrize("threshold", [None, 0.0, -1.5])
def test_missing_zero_or_negative_threshold_disables_the_rule(threshold: float | None) -> None:
    assert not should_early_stop(1e9, threshold)


@pytest.mark.parametrize(
    ("ratio_mean", "threshold", "expected"),
    [
        (1.01, 1.5, False),  # below
        (1.5, 1.5, False),  # at the threshold: not exceeded
        (1.51, 1.5, True),  # above
        (3.0, 2.0, True),
    ],
)
def test_stops_only_when_the_mean_ratio_exceeds_the_threshold(
    ratio_mean: float, threshold: float, expected: bool
) -> None:
    assert should_early_stop(ratio_mean, threshold) is expected
