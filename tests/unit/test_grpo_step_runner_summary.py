"""benchmarks/grpo_step_runner.py's summary of the runner's metrics rows: the warm-up step is
dropped, phases are means of the later steps, transitions are grouped, shares sum to 1."""

import pytest

from benchmarks.grpo_step_runner import summarize


def row(step, step_s, rollout, train, release, kv, tokens, memory):
    return {
        "step": step,
        "time/step": step_s,
        "time/rollout": rollout,
        "time/reward": 0.5,
        "time/logprobs": 1.0,
        "time/train": train,
        "time/weight_sync": 0.25,
        "time/rollout_release": release,
        "time/rollout_resume_kv_cache": kv,
        "rollout/num_response_tokens": tokens,
        "rollout/logprob_abs_diff": 0.001,
        "memory/weight_sync_gib": memory,
    }


def test_summary_drops_the_warm_up_step_and_groups_the_transitions():
    rows = [
        {"step": 0, "val/accuracy": 0.1},  # validation row: no time/step
        row(1, 100.0, 90.0, 5.0, 1.0, 1.0, 1000, 50.0),  # warm-up: engine compiles
        row(2, 10.0, 4.0, 2.0, 0.5, 0.25, 2048, 40.0),
        row(3, 12.0, 6.0, 2.0, 0.5, 0.75, 2048, 42.0),
    ]
    s = summarize(rows, num_gpus=2)
    assert s["steps_timed"] == 2
    assert s["step_seconds"] == 11.0
    assert s["phase_seconds"]["rollout"] == 5.0
    assert s["phase_seconds"]["offload_onload"] == 1.0  # 0.5 release + 0.5 mean KV resume
    # 11 - (5 + 0.5 + 1 + 2 + 0.25 + 1)
    assert s["phase_seconds"]["other"] == pytest.approx(1.25)
    assert sum(s["phase_share"].values()) == pytest.approx(1.0, abs=2e-3)
    assert s["response_tokens_per_s_per_gpu"] == round(2048 / 11.0 / 2, 1)
    assert s["memory_gib_after"] == {"weight_sync_gib": 41.0}


def test_summary_needs_a_step_after_the_warm_up():
    with pytest.raises(ValueError, match="at least 2 train steps"):
        summarize([row(1, 1.0, 1.0, 1.0, 0.0, 0.0, 10, 1.0)])
