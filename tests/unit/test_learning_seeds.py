"""benchmarks/learning_seeds.py: which runs it plans, where they run, and what their curves add up to."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import learning_seeds as ls
from benchmarks.learning_curves import read_rows

DATA = Path(__file__).parents[2] / "docs" / "data"
TORCH = "torch=actor.training_backend=torch,actor.model.precision=fp32"


def _args(recipe: str, parallel: int, *variants: str, overrides=()) -> argparse.Namespace:
    return argparse.Namespace(
        recipe=recipe, seeds="1234,1,2", variant=list(variants) or None, out="/tmp/o",
        parallel=parallel, overrides=list(overrides),
    )  # fmt: skip


def _share(run: ls.Run) -> list[str]:
    return [o for o in run.overrides if o.startswith("rollout.gpu_memory_utilization=")]


def test_runs_sharing_one_gpu_split_the_engines_memory_and_runs_with_a_gpu_each_do_not():
    runs = ls.plan_runs(_args("tiny-moe-grpo-gpu", 3, "megatron-te", TORCH), gpus=[0])
    assert [r.tag for r in runs] == [f"{v}-s{s}" for v in ("megatron-te", "torch") for s in (1234, 1, 2)]
    assert [r.variant for r in runs] == ["megatron-te"] * 3 + ["torch"] * 3 and {r.gpu for r in runs} == {0}
    assert all(_share(r) == ["rollout.gpu_memory_utilization=0.1"] for r in runs)  # the recipe's 0.3 / 3
    torch_run = runs[3].overrides
    assert torch_run[0] == "runner.seed=1234" and "actor.training_backend=torch" in torch_run
    assert runs[0].overrides[2] == "runner.logger.log_path=/tmp/o/megatron-te-s1234/logs"

    spread = ls.plan_runs(_args("tiny-moe-grpo-gpu", 6, "megatron-te", TORCH), gpus=list(range(8)))
    assert [r.gpu for r in spread] == [0, 1, 2, 3, 4, 5] and not any(_share(r) for r in spread)
    two_each = ls.plan_runs(_args("tiny-moe-grpo-gpu", 6, "megatron-te", TORCH), gpus=[0, 1, 2])
    assert [r.gpu for r in two_each] == [0, 1, 2, 0, 1, 2] and _share(two_each[0]) == [
        "rollout.gpu_memory_utilization=0.15"
    ]
    mine = ls.plan_runs(
        _args("tiny-moe-grpo-gpu", 3, overrides=["rollout.gpu_memory_utilization=0.2"]), gpus=[0]
    )
    assert all(_share(r) == ["rollout.gpu_memory_utilization=0.2"] for r in mine)  # the user's, once
    cpu = ls.plan_runs(_args("tiny-moe-grpo-cpu", 3), gpus=[0])  # the torch rollout has no such key
    assert [r.tag for r in cpu] == ["recipe-s1234", "recipe-s1", "recipe-s2"] and not any(
        _share(r) for r in cpu
    )


def test_a_variant_without_a_name_is_refused():
    assert ls.parse_variant(TORCH) == (
        "torch",
        ["actor.training_backend=torch", "actor.model.precision=fp32"],
    )
    assert ls.parse_variant("megatron-te") == ("megatron-te", [])
    with pytest.raises(ValueError, match="expected NAME"):
        ls.parse_variant("=actor.lr=1")


def test_the_runs_add_up_to_the_documented_three_seed_figures(tmp_path):
    # docs/benchmarks.md, "Tiny recipe end to end": gains 23.4, 20.3, 21.9 (off) and dynamic
    # sampling's 51.6, 55.5, 49.2 % at step 100 from the same starts
    runs = []
    for variant, stem in (
        ("off", "tiny_cpu_seed{}_2026-12-03"),
        ("on", "tiny_cpu_dynamic_sampling_seed{}_2026-12-04"),
    ):
        for seed in (1234, 1, 2):
            run = ls.Run(f"{variant}-s{seed}", [], tmp_path / f"{variant}-s{seed}", variant, code=0)
            run.proc = object()
            run.metrics.parent.mkdir(parents=True)
            run.metrics.write_text((DATA / f"{stem.format(seed)}.jsonl").read_text())
            runs.append(run)
    summary = ls.summarize_runs(runs)
    off, on = summary["variants"]["off"], summary["variants"]["on"]
    assert [summary["runs"][f"off-s{s}"]["gain_points"] for s in (1234, 1, 2)] == [23.4, 20.3, 21.9]
    assert (off["gain_mean_points"], off["gain_min_points"], off["runs_with_a_gain"]) == (21.9, 20.3, 3)
    assert on["val_last_mean"] == pytest.approx((0.5156 + 0.5547 + 0.4922) / 3, abs=1e-4)
    assert on["gain_mean_minus_first_points"] == round(on["gain_mean_points"] - 21.9, 1)
    assert len(read_rows(runs[0].metrics)) > 100


def test_a_run_cut_off_or_never_started_says_so(tmp_path):
    cut = ls.Run("a-s1", [], tmp_path / "a", "a", cut_off=True)
    cut.proc = object()
    cut.metrics.parent.mkdir(parents=True)
    cut.metrics.write_text('{"step": 0, "val/accuracy": 0.25}\n{"step": 1, "rollout/reward_mean": 0.1}\n')
    waiting = ls.Run("a-s2", [], tmp_path / "b", "a")
    summary = ls.summarize_runs([cut, waiting])
    assert summary["runs"]["a-s1"]["cut_off_at_step"] == 1
    assert summary["runs"]["a-s2"] == {"gpu": None, "exit": None, "not_started": True}
    assert summary["variants"]["a"]["runs"] == 2


def test_a_run_failing_before_its_first_validation_starts_again_once(tmp_path, monkeypatch):
    # attempt 1 of a-s1 fails before validating (as an engine that found too little memory); attempt 2
    # validates. b-s1 fails before validating on both attempts: it is not started a third time.
    attempts: list[str] = []

    def start(recipe, overrides, log, env=None):
        tag = Path(log).parent.name
        attempts.append(tag)
        ok = tag == "a-s1" and attempts.count(tag) == 2
        metrics = Path(log).parent / "logs" / "metrics.jsonl"
        metrics.parent.mkdir(parents=True, exist_ok=True)
        rows = (
            '{"step": 0, "val/accuracy": 0.5}\n{"step": 1, "val/accuracy": 0.75}\n' if ok else '{"step": 0}\n'
        )
        script = f"import pathlib, sys; pathlib.Path({str(metrics)!r}).write_text({rows!r}); sys.exit({0 if ok else 1})"
        Path(log).write_text(f"attempt {attempts.count(tag)}\n")
        return subprocess.Popen([sys.executable, "-c", script])

    monkeypatch.setattr(ls, "start_recipe", start)
    monkeypatch.setattr(ls, "POLL_S", 0.05)
    runs = [ls.Run(t, [], tmp_path / t, t[0]) for t in ("a-s1", "b-s1")]
    ls.run_all(runs, "tiny-moe-grpo-gpu", parallel=2, deadline=time.monotonic() + 20)

    assert attempts == ["a-s1", "b-s1", "a-s1", "b-s1"]
    summary = ls.summarize_runs(runs)["runs"]
    assert summary["a-s1"]["exit"] == 0 and summary["a-s1"]["gain_points"] == 25.0
    assert summary["a-s1"]["restarted"] and summary["b-s1"]["restarted"] and summary["b-s1"]["exit"] == 1
    assert (tmp_path / "a-s1" / "run.attempt1.log").read_text() == "attempt 1\n"
    assert (tmp_path / "a-s1" / "run.log").read_text() == "attempt 2\n"
