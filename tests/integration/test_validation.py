"""Validation on a known dataset: the runner's greedy accuracy equals an independent reference
(transformers' own generate + the grader) on the same problems, read through the file loader."""

from pathlib import Path

import pytest
import torch

from rlinf.config import load_config
from rlinf.data.synthetic import generate_arithmetic, write_jsonl
from rlinf.models.tiny import TinyModelSettings, ensure_tiny_checkpoint
from rlinf.rewards.math import grade

pytestmark = pytest.mark.slow


def _reference_greedy_accuracy(checkpoint: Path, problems) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    correct = 0
    for problem in problems:  # one at a time: no padding, nothing shared with our sampler
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": problem.record.prompt}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
        out = model.generate(**ids, do_sample=False, max_new_tokens=64)
        response = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        correct += grade(response, problem.record.solutions)
    return correct / len(problems)


def test_runner_validation_matches_an_independent_reference(tmp_path, ray_session):
    from rlinf.models.loader import load_tokenizer
    from rlinf.runners.data_setup import build_datasets
    from rlinf.runners.grpo_runner import GRPORunner
    from rlinf.scheduler.roles import launch_roles
    from rlinf.utils.metrics import MetricLogger

    checkpoint = ensure_tiny_checkpoint()
    tiny = TinyModelSettings()
    task = {"digits": tiny.digits, "operations": tiny.operations, "steps": tiny.steps, "seed": 7}
    val_problems = generate_arithmetic("val", 48, **task)
    write_jsonl(val_problems, tmp_path / "val.jsonl")
    write_jsonl(generate_arithmetic("train", 64, **task), tmp_path / "train.jsonl")
    cfg = load_config(
        "tiny-moe-grpo-cpu",
        [
            f"actor.model.model_path={checkpoint}",
            "data.type=math",
            f"data.train_data_paths=[{tmp_path / 'train.jsonl'}]",
            f"data.val_data_paths=[{tmp_path / 'val.jsonl'}]",
            "algorithm.val_n=4",
            f"runner.output_dir={tmp_path / 'results'}",
        ],
    )
    train, val, _ = build_datasets(cfg, load_tokenizer(str(checkpoint)))
    assert [item.solutions for item in val] == [p.record.solutions for p in val_problems]
    roles = launch_roles(cfg)
    try:
        metrics = GRPORunner(cfg, roles, train, val, MetricLogger(tmp_path / "logs", ())).validate()
    finally:
        roles.shutdown()

    reference = _reference_greedy_accuracy(checkpoint, val_problems)
    assert 0.15 <= reference <= 0.6  # the warm-started model is partly right: a meaningful comparison
    assert metrics["val/accuracy"] == pytest.approx(reference, abs=1.5 / len(val_problems))
    assert 0.0 < metrics["val/mean@4"] <= metrics["val/pass@4"] <= 1.0
