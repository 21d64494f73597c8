"""benchmarks/learning_seeds.py runs real recipe runs side by side; each learns exactly what it learns
when run alone (separate folders, Ray sessions and ports; one model build)."""

from __future__ import annotations

import json

import pytest

from benchmarks import learning_seeds
from benchmarks.learning_curves import read_rows
from tests.integration.conftest import small_run_overrides

pytestmark = pytest.mark.slow


def _overrides(checkpoint, tmp_path) -> list[str]:
    own = ("runner.output_dir=", "runner.logger.log_path=")  # learning_seeds gives each run its own
    extra = {"runner.val_check_interval": 1, "runner.max_steps": 2}
    return [o for o in small_run_overrides(checkpoint, tmp_path, **extra) if not o.startswith(own)]


def _curves(out, tag) -> list[dict]:
    """Every metric a run logged but its timings (entropy, response lengths, rewards, accuracy...)."""
    rows = read_rows(out / tag / "logs" / "metrics.jsonl")
    return [
        {k: v for k, v in row.items() if not k.startswith(("time/", "throughput/", "memory/"))}
        for row in rows
    ]


def test_runs_side_by_side_learn_what_they_learn_alone(random_tiny_checkpoint, tmp_path, capsys):
    overrides = _overrides(random_tiny_checkpoint, tmp_path)
    both, alone = tmp_path / "both", tmp_path / "alone"
    common = ["tiny-moe-grpo-cpu", *overrides, "--variant", "v"]
    assert learning_seeds.main([*common, "--seeds", "1,2", "--parallel", "2", "--out", str(both)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {tag: run["steps"] for tag, run in result["runs"].items()} == {"v-s1": 2, "v-s2": 2}
    assert result["variants"]["v"]["runs_with_a_gain"] == 2
    assert learning_seeds.main([*common, "--seeds", "2", "--parallel", "1", "--out", str(alone)]) == 0
    assert _curves(both, "v-s2") == _curves(alone, "v-s2")
    assert _curves(both, "v-s1") != _curves(both, "v-s2")  # the seed reaches each run
