"""A few GRPO steps through the real runner with the Megatron actor (Ray, torch rollout, one GPU):
rewards and the rollout/actor logprob mismatch reach TensorBoard.

Checkpoint: RLINF_GPU_TINY (a warm-started GPU-tiny built on the CPU machine and carried), else a
random GPU-tiny built here. Run: bash tests/gpu/run_megatron_checks.sh
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from gpu_checks import record
from grpo_run import run_tiny_grpo

STEPS = 3


def test_grpo_steps_with_the_megatron_actor(megatron_installed, request, tmp_path):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("needs ray (carry .wray on the device)")
    model = os.environ.get("RLINF_GPU_TINY") or str(request.getfixturevalue("gpu_tiny"))
    steps = run_tiny_grpo(
        tmp_path,
        [
            "actor.training_backend=megatron",
            "actor.num_threads=null",
            f"actor.model.model_path={model}",
            "actor.model.precision=bf16",
            "rollout.model.precision=bf16",
        ],
        steps=STEPS,
        step_key="actor/loss",
        required=("rollout/reward_mean", "rollout/logprob_abs_diff", "actor/grad_norm"),
        timeout=270,  # inside the script's 300 s: a slow run still reports its log tail
    )
    record(
        "GRPO through the runner: megatron actor (bf16) + torch rollout (bf16), one GPU",
        steps=len(steps),
        reward_mean=[round(r["rollout/reward_mean"], 3) for r in steps],
        logprob_abs_diff=[round(r["rollout/logprob_abs_diff"], 5) for r in steps],
        grad_norm=[round(r["actor/grad_norm"], 4) for r in steps],
        time_step_s=[round(r["time/step"], 2) for r in steps if "time/step" in r],
    )
    # same bf16 weights on both sides after every sync: a stale rollout would drift far above this
    assert max(r["rollout/logprob_abs_diff"] for r in steps) <= 5e-2
