"""GRPO learns: the tiny CPU recipe, trained with a fixed seed on the same 16 problems every step,
raises its sampled accuracy on them.

Every step samples 8 responses to each of the 16 problems (128 per step). The mean accuracy of the
last five steps must exceed that of the first five by MARGIN. Broken learning misses it: with the
advantages' sign flipped the accuracy falls, and with a learning rate of 0 the policy never changes
(docs/benchmarks.md, "The tiny CPU recipe learns").
"""

import json
import statistics

import pytest

from rlinf.config import load_config
from rlinf.runners.main import run

pytestmark = pytest.mark.slow

STEPS, WINDOW = 30, 5
MARGIN = 0.10  # sampled accuracy (as a fraction) the last window must gain over the first


def learning_overrides(out, **extra) -> list[str]:
    overrides = {
        "runner.output_dir": str(out / "results"),
        "runner.logger.log_path": str(out / "logs"),
        "runner.logger.plot": False,
        "runner.max_steps": STEPS,
        "runner.val_check_interval": 0,
        "runner.save_interval": 0,
        "runner.save_at_end": False,
        "data.synthetic.num_train": 16,  # one prompt batch: the same problems every step
        "data.rollout_batch_size": 16,
    }
    overrides.update(extra)
    return [f"{k}={v}" for k, v in overrides.items()]


def test_the_tiny_recipe_raises_sampled_accuracy_on_its_problems(tmp_path, ray_session):
    assert run(load_config("tiny-moe-grpo-cpu", learning_overrides(tmp_path))) == 0
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    accuracy = [r["rollout/accuracy"] for r in rows if "rollout/accuracy" in r]
    assert len(accuracy) == STEPS
    first, last = statistics.fmean(accuracy[:WINDOW]), statistics.fmean(accuracy[-WINDOW:])
    assert last - first >= MARGIN, f"sampled accuracy {first:.3f} -> {last:.3f}; per step: {accuracy}"
