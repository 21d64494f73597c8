"""The LR schedule both actors use (rlinf/algorithms/lr_schedule.py): known values (its refusals are
cases in test_config_rules.py)."""

import itertools
import math

import pytest

from rlinf.algorithms.lr_schedule import lr_decay_steps, lr_multiplier, lr_multiplier_from_config
from rlinf.config import load_config


def test_constant_and_warmup_constant():
    assert [lr_multiplier("constant", 4)(k) for k in (0, 3, 100)] == [1.0, 1.0, 1.0]
    assert [lr_multiplier("warmup_constant", 4)(k) for k in (0, 1, 3, 4, 100)] == [0.25, 0.5, 1.0, 1.0, 1.0]


def test_cosine_known_values():
    at = lr_multiplier("cosine", warmup_steps=2, decay_steps=12, min_lr_ratio=0.1)
    assert [at(0), at(1)] == [0.5, 1.0]  # the warmup
    assert at(2) == pytest.approx(1.0)  # the decay starts at the peak
    assert at(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # halfway: 0.55
    assert at(12) == pytest.approx(0.1) and at(50) == pytest.approx(0.1)  # reached, then held
    values = [at(k) for k in range(2, 13)]
    assert all(a > b for a, b in itertools.pairwise(values))  # strictly decreasing over the decay


def test_recipe_decays_over_the_runs_optimizer_steps():
    # tiny recipe: 16 prompts x 8 samples / 64 per minibatch = 2 optimizer steps per GRPO step
    cfg = load_config(
        "tiny-moe-grpo-cpu",
        [
            "actor.lr_sched.lr_decay_style=cosine",
            "actor.lr_sched.min_lr_ratio=0.1",
            "runner.max_steps=50",
        ],
    )
    assert lr_decay_steps(cfg) == 100
    at = lr_multiplier_from_config(cfg)
    assert at(100) == pytest.approx(0.1) and at(99) > 0.1
    given = load_config(
        "tiny-moe-grpo-cpu", ["actor.lr_sched.lr_decay_style=cosine", "actor.lr_sched.lr_decay_steps=40"]
    )
    assert lr_decay_steps(given) == 40
