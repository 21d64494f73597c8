"""Validation on a known dataset: the runner's greedy accuracy equals an independent reference
(transformers' own generate + the grader) on the same problems, read through the file loader."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlinf.config import load_config
from rlinf.data.synthetic import generate_arithmetic, write_jsonl
from rlinf.models.tiny import TinyModelSettings, ensure_tiny_checkpoint
from rlinf.rewards.math_grader import grade

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
    from rlinf.models.hf_checkpoint import load_tokenizer
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
        runner = GRPORunner(cfg, roles, train, val, MetricLogger(tmp_path / "logs", ()))
        metrics = runner.validate()
        # pass@4 and mean@4 recomputed from the sampled batch itself (same seed, one generate call)
        sampled = roles.rollout.call_rank0(
            "generate", list(val), 4, runner.sampling, runner._seed("validation")
        )
        scored = roles.reward.score(sampled)
        by_problem: dict[int, list[bool]] = {}
        for group, right in zip(scored.group_index.tolist(), scored.correct.tolist(), strict=True):
            by_problem.setdefault(group, []).append(right)
        assert len(by_problem) == 48 and all(len(v) == 4 for v in by_problem.values())
        expected_pass = sum(any(v) for v in by_problem.values()) / 48
        expected_mean = sum(sum(v) for v in by_problem.values()) / (48 * 4)
        # data.val_batch_size=5: ten generate calls per pass, the same greedy accuracy
        chunked_cfg = replace(cfg, data=replace(cfg.data, val_batch_size=5))
        chunked = GRPORunner(chunked_cfg, roles, train, val, MetricLogger(tmp_path / "logs2", ()))
        calls: list[int] = []
        real_score = chunked._score
        chunked._score = lambda items, *rest: calls.append(len(items)) or real_score(items, *rest)
        chunked_metrics = chunked.validate()
    finally:
        roles.shutdown()
    assert metrics["val/pass@4"] == pytest.approx(expected_pass)
    assert metrics["val/mean@4"] == pytest.approx(expected_mean)
    assert calls == [5] * 9 + [3] + [5] * 9 + [3]  # greedy pass, then the sampled pass
    assert chunked_metrics["val/accuracy"] == pytest.approx(metrics["val/accuracy"], abs=1.5 / 48)

    reference = _reference_greedy_accuracy(checkpoint, val_problems)
    assert 0.15 <= reference <= 0.6  # the warm-started model is partly right: a meaningful comparison
    assert metrics["val/accuracy"] == pytest.approx(reference, abs=1.5 / len(val_problems))
    assert 0.0 < metrics["val/mean@4"] < metrics["val/pass@4"] <= 1.0
