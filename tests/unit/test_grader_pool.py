"""Tests of MathReward: batch scores, per-item timeouts and pool recovery (CPU only)."""

from __future__ import annotations

import time

import pytest

from rlinf.rewards.grader_pool import MathReward, RewardResult
from rlinf.rewards.registry import REWARDS, build_reward

# Survives every guard in grade() and then keeps sympy busy for minutes.
SLOW_RESPONSE = "\\boxed{\\begin{pmatrix}(x+y+z+w+1)^{30} \\\\ 1\\end{pmatrix}}"
SLOW_SOLUTION = ["\\begin{pmatrix}x\\\\1\\end{pmatrix}"]


@pytest.fixture(scope="module")
def reward():
    with MathReward(reward_scale=5.0, timeout_s=1.0, num_workers=2) as r:
        yield r


def _worker_pids(r: MathReward) -> set[int]:
    return {w.process.pid for w in r._workers}


def test_scores_right_and_wrong_answers(reward):
    result = reward.score(
        ["so \\boxed{\\frac{14}{3}}", "\\boxed{5}", "the answer is 18", "\\boxed{(2,-1)}", "\\boxed{x=3}"],
        [["\\frac{14}{3}"], ["6"], ["18"], ["(2, -1)"], ["The answer is $\\boxed{3}$."]],
    )
    assert isinstance(result, RewardResult)
    assert result.correct == [True, False, False, True, True]
    assert result.rewards == [5.0, -5.0, -5.0, 5.0, 5.0]
    assert result.timeouts == 0


def test_large_batch_matches_expected_order(reward):
    responses = [f"\\boxed{{{i}}}" for i in range(300)]
    solutions = [[str(i if i % 3 else i + 1)] for i in range(300)]
    result = reward.score(responses, solutions)
    assert result.correct == [i % 3 != 0 for i in range(300)]
    assert result.timeouts == 0


def test_empty_batch_and_length_mismatch(reward):
    assert reward.score([], []) == RewardResult(rewards=[], correct=[], timeouts=0)
    with pytest.raises(ValueError):
        reward.score(["\\boxed{1}"], [])


def test_pathological_answers_are_wrong_within_the_timeout(reward):
    responses = [
        "\\boxed{9^{9^{9^{9^{9}}}}}",
        "x" * 200_000 + "\\boxed{5}",
        "\\boxed{" + "{" * 10_000,
        "\\boxed{",
        "\\boxed{5",
        "\\boxed{5}",
    ]
    start = time.perf_counter()
    result = reward.score(responses, [["1"], ["6"], ["5"], ["5"], ["5"], ["5"]])
    assert time.perf_counter() - start < 5.0
    assert result.correct == [False] * 5 + [True]


def test_a_stuck_item_times_out_and_its_worker_is_replaced(reward):
    before = _worker_pids(reward)
    responses = ["\\boxed{1}", SLOW_RESPONSE] + [f"\\boxed{{{i}}}" for i in range(20)]
    solutions = [["1"], SLOW_SOLUTION] + [[str(i)] for i in range(20)]
    start = time.perf_counter()
    result = reward.score(responses, solutions)
    elapsed = time.perf_counter() - start

    assert result.timeouts == 1
    assert result.correct == [True, False] + [True] * 20
    assert result.rewards[1] == -5.0
    assert elapsed < 15.0  # the stuck item alone would take minutes
    after = _worker_pids(reward)
    assert len(before - after) == 1 and len(after) == 2  # exactly one worker was killed and replaced

    # The pool keeps working after the kill.
    again = reward.score(["\\boxed{\\sqrt{8}}", "\\boxed{3}"], [["2\\sqrt{2}"], ["4"]])
    assert again.correct == [True, False]
    assert again.timeouts == 0


def test_a_worker_that_died_while_idle_is_replaced(reward):
    victim = reward._workers[0].process
    victim.kill()
    victim.join(timeout=10)
    result = reward.score([f"\\boxed{{{i}}}" for i in range(50)], [[str(i)] for i in range(50)])
    assert result.correct == [True] * 50
    assert result.timeouts == 0
    assert victim.pid not in _worker_pids(reward)


def test_several_stuck_items_in_one_batch_are_each_counted():
    with MathReward(reward_scale=1.0, timeout_s=0.5, num_workers=1) as r:
        result = r.score(
            [SLOW_RESPONSE, "\\boxed{2}", SLOW_RESPONSE, "\\boxed{3}"], [SLOW_SOLUTION, ["2"]] * 2
        )
        assert result.timeouts == 2
        assert result.correct == [False, True, False, False]
        assert result.rewards == [-1.0, 1.0, -1.0, -1.0]


def test_close_stops_the_workers():
    r = MathReward(num_workers=1)
    processes = [w.process for w in r._workers]
    r.close()
    r.close()  # idempotent
    assert not any(p.is_alive() for p in processes)
    with pytest.raises(RuntimeError):
        r.score(["\\boxed{1}"], [["1"]])


def test_invalid_arguments():
    with pytest.raises(ValueError):
        MathReward(timeout_s=0)
    with pytest.raises(ValueError):
        MathReward(num_workers=0)


def test_registry_builds_math_reward_and_rejects_unknown_names():
    assert REWARDS["math"] is MathReward
    with build_reward("math", reward_scale=2.0, timeout_s=3.0, num_workers=1) as r:
        assert isinstance(r, MathReward)
        assert r.score(["\\boxed{1}"], [["1"]]).rewards == [2.0]
    with pytest.raises(ValueError, match="math"):
        build_reward("code")


def test_a_worker_killed_while_starting_is_replaced():
    with MathReward(reward_scale=1.0, num_workers=2) as r:
        starting = r._workers[0].process
        starting.kill()  # at once: before it could report ready
        starting.join(timeout=10)
        result = r.score([f"\\boxed{{{i}}}" for i in range(20)], [[str(i)] for i in range(20)])
        assert result.correct == [True] * 20
        assert starting.pid not in _worker_pids(r)
