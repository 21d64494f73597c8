"""benchmarks.supervised_control: the supervised reference for a tiny recipe's GRPO gain."""

from __future__ import annotations

import pytest

from benchmarks.supervised_control import supervised_control
from rlinf.data.synthetic import generate_arithmetic
from rlinf.models import load_causal_lm, load_tokenizer
from rlinf.models.bootstrap import greedy_accuracy
from rlinf.models.tiny import TINY_URI, resolve_model_path


def test_twenty_supervised_steps_settle_the_cpu_default_warm_start() -> None:
    result = supervised_control("tiny-moe-grpo-cpu", [], steps=20)
    assert (result["val_problems"], result["lr"], result["batch_size"], result["seed"]) == (
        128,
        6e-5,
        64,
        1234,
    )
    # docs/models.md: 27.3% -> 53.1% on the 2-core reference machine, the same start as GRPO's step 0.
    assert 0.15 <= result["greedy_accuracy_before"] <= 0.45
    assert result["greedy_accuracy_after"] - result["greedy_accuracy_before"] >= 0.15


def test_it_measures_on_the_validation_problems_of_the_run_s_seed() -> None:
    """The GRPO run validates on `runner.seed`'s split; so must its control."""
    result = supervised_control("tiny-moe-grpo-cpu", ["runner.seed=1"], steps=0)
    path = resolve_model_path(TINY_URI)
    model, tokenizer = load_causal_lm(path), load_tokenizer(path)
    val = generate_arithmetic("val", 128, digits=1, operations=("+", "-"), steps=2, seed=1)
    expected = greedy_accuracy(model, tokenizer, val).accuracy
    assert result["greedy_accuracy_before"] == result["greedy_accuracy_after"] == expected


def test_a_recipe_without_the_synthetic_task_is_refused(tmp_path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    with pytest.raises(SystemExit, match="synthetic task"):
        supervised_control(
            "tiny-moe-grpo-cpu",
            ["data.type=math", f"data.train_data_paths=[{data}]", f"data.val_data_paths=[{data}]"],
            steps=1,
        )
