"""benchmarks/grpo_step_runner.py's summary of the runner's metrics rows: the warm-up step is
dropped, phases are means of the later steps, transitions are grouped, shares sum to 1."""

import pytest

from benchmarks.grpo_step_runner import staleness_runs, staleness_speedup, summarize


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
        {"step": 0, "data/train_prompts": 64, "time/startup_ray": 3.04, "time/startup_actor": 61.26},
        row(1, 100.0, 90.0, 5.0, 1.0, 1.0, 1000, 50.0),  # warm-up: engine compiles
        row(2, 10.0, 4.0, 2.0, 0.5, 0.25, 2048, 40.0),
        row(3, 12.0, 6.0, 2.0, 0.5, 0.75, 2048, 42.0),
    ]
    s = summarize(rows, num_gpus=2)
    assert s["startup_split_seconds"] == {"ray": 3.0, "actor": 61.3}
    assert s["steps_timed"] == 2
    assert s["step_seconds"] == 11.0
    assert s["phase_seconds"]["rollout"] == 5.0
    assert s["phase_seconds"]["offload_onload"] == 1.0  # 0.5 release + 0.5 mean KV resume
    # 11 - (5 + 0.5 + 1 + 2 + 0.25 + 1)
    assert s["phase_seconds"]["other"] == pytest.approx(1.25)
    assert sum(s["phase_share"].values()) == pytest.approx(1.0, abs=2e-3)
    assert s["response_tokens_per_s_per_gpu"] == round(2048 / 11.0 / 2, 1)
    assert s["memory_gib_after"] == {"weight_sync_gib": 41.0}


def test_an_auto_resident_decision_reports_its_transition_step_apart():
    """Step 1 offloads and decides to keep the actor resident; step 2 onloads it once and
    recaptures the graphs; the steady steps start at 3."""
    decided = row(1, 100.0, 90.0, 5.0, 1.0, 1.0, 1000, 50.0) | {"actor/offload_between_phases": 0.0}
    onloads = row(2, 11.0, 3.0, 3.5, 0.0, 0.0, 2048, 40.0) | {
        "time/actor_onload": 2.5, "time/cuda_graph_capture": 1.0,
    }  # fmt: skip
    steady = [row(3, 7.0, 3.0, 2.5, 0.0, 0.0, 2048, 40.0), row(4, 8.0, 3.0, 2.5, 0.0, 0.0, 2048, 40.0)]
    s = summarize([decided, onloads, *steady])
    assert s["steps_timed"] == 2 and s["step_seconds"] == 7.5
    assert s["transition_step"] == {
        "step": 2,
        "step_seconds": 11.0,
        "once": {"actor_onload": 2.5, "cuda_graph_capture": 1.0},
    }
    # a decision to keep offloading, or too few steps, changes nothing
    kept = summarize([decided | {"actor/offload_between_phases": 1.0}, onloads, *steady])
    assert kept["steps_timed"] == 3 and "transition_step" not in kept
    short = summarize([decided, onloads])
    assert short["steps_timed"] == 1 and short["step_seconds"] == 11.0 and "transition_step" not in short


def test_summary_needs_a_step_after_the_warm_up():
    with pytest.raises(ValueError, match="at least 2 train steps"):
        summarize([row(1, 1.0, 1.0, 1.0, 0.0, 0.0, 10, 1.0)])


def test_staleness_fields_and_the_speedup_over_the_first_bound():
    lagged = {"staleness/mean": 1.0, "staleness/max": 1.0, "actor/tis_clip_fraction": 0.02}
    rows = [row(s, t, 4.0, 2.0, 0.0, 0.0, 2048, 40.0) for s, t in ((1, 50.0), (2, 8.0), (3, 8.0))]
    sync = summarize(rows)
    assert "staleness_mean" not in sync  # the synchronous loop logs no staleness metrics
    ahead = summarize(
        [r | lagged for r in rows[:2]] + [rows[2] | lagged | {"staleness/regenerated_samples": 3.0}]
    )
    assert ahead["staleness_mean"] == 1.0 and ahead["staleness_max"] == 1.0
    assert ahead["stale_rows_regenerated"] == 3.0 and ahead["tis_clip_fraction"] == 0.02
    result = {
        "staleness_0": {"response_tokens_per_s_per_gpu": 100.0},
        "staleness_1": {"response_tokens_per_s_per_gpu": 140.0},
    }
    assert staleness_speedup(result) == {"staleness_speedup": {"staleness_0": 1.0, "staleness_1": 1.4}}
    assert staleness_speedup({"main": {}}) == {}


def test_each_staleness_run_is_a_valid_recipe_that_differs_only_in_the_bound(tmp_path):
    """The runs --staleness 0,1 starts are the one-GPU Moonlight recipe the benchmark runs, and the
    config checks accept each (a bound >= 1 on one GPU needs both roles resident and the off-policy
    loss)."""
    from types import SimpleNamespace

    from benchmarks.grpo_step_runner import overrides
    from rlinf.config import load_config

    args = SimpleNamespace(
        steps=4, save_at_end=False, group_size=8, minibatches=4, prompt_len=256, micro_batch=8, smoke=False,
        actor="megatron", rollout="sglang", rollout_memory=0.5, reward_workers=2, override=[],
        logprob_micro_batch=None,
    )  # fmt: skip
    runs = staleness_runs("0,1", 32, 512)
    assert [r[0] for r in runs] == ["staleness_0", "staleness_1"]
    base = overrides(args, tmp_path / "ckpt", tmp_path / "prompts.jsonl", tmp_path / "out", 32, 512)
    configs = [load_config("moonlight-16b-grpo-megatron", [*base, *extra]) for *_, extra, _ in runs]
    assert [c.runner.max_staleness for c in configs] == [0, 1]
    assert all(c.actor.offload_between_phases is False for c in configs)
    assert all(c.algorithm.rollout_is.mode == "token_tis" and c.algorithm.recompute_logprobs for c in configs)
    assert {c.actor.global_batch_size for c in configs} == {64}
    # the logprob pass follows the runner's micro-batch, not the recipe's rows for its own
    assert {(c.actor.micro_batch_size, c.actor.logprob_micro_batch_size) for c in configs} == {(8, None)}
    args.logprob_micro_batch = 32
    wider = overrides(args, tmp_path / "ckpt", tmp_path / "prompts.jsonl", tmp_path / "out", 32, 512)
    assert load_config("moonlight-16b-grpo-megatron", wider).actor.logprob_micro_batch_size == 32
