"""The whole GRPO loop colocated on one GPU: SGLang rollout + torch or Megatron actor through Ray, several
steps, with rewards, the rollout/actor logprob mismatch and time/weight_sync in TensorBoard.

Needs ray + sglang on the device (two back-to-back device calls; docs/sglang.md). The checkpoint is
RLINF_GPU_TINY (a warm-started GPU-tiny, built on the CPU machine and carried) or tiny://bootstrap-gpu's cached build.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from gpu_checks import record
from grpo_run import run_tiny_grpo

from rlinf.models.tiny import TINY_GPU_URI, resolve_model_path

STEPS = 4
ACTORS = {
    # fp32 actor against the bf16 engine: the mismatch then also shows the engine's bf16 rounding.
    "torch": ["actor.model.precision=fp32"],
    # The Moonlight path: Megatron actor, CUDA IPC from Megatron-Bridge's GPU export.
    "megatron": ["actor.training_backend=megatron", "actor.num_threads=null", "actor.model.precision=bf16"],
}
# ... and with the actor offloaded between phases (every colocated transition runs and is
# measured). This variant crashed the engine once on the H200 (docs/benchmarks.md); the resident
# one separates the offload from the rest of the path.
ACTORS["megatron_offload"] = [*ACTORS["megatron"], "actor.offload_between_phases=true"]


@pytest.mark.parametrize("actor", ACTORS)
def test_grpo_loop_colocated_on_one_gpu(cuda, sglang_installed, tmp_path, actor):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("needs ray (carry .wray on the device)")
    if actor.startswith("megatron") and importlib.util.find_spec("megatron") is None:
        pytest.skip("needs megatron-core (carry .wmeg on the device)")
    # Resolved (built into the cache on a machine's first run) here, outside the run's timeout:
    # GPU-tiny's 800-step warm start takes minutes of one CPU core.
    model = os.environ.get("RLINF_GPU_TINY") or resolve_model_path(TINY_GPU_URI)
    steps = run_tiny_grpo(
        tmp_path,
        [
            f"actor.model.model_path={model}",
            *ACTORS[actor],
            "rollout.rollout_backend=sglang",
            "rollout.model.precision=bf16",
            "rollout.gpu_memory_utilization=0.3",
            "rollout.sglang.attention_backend=triton",
            "rollout.sglang.cuda_graph_max_bs=16",
        ],
        steps=STEPS,
        step_key="time/weight_sync",
        required=("rollout/reward_mean", "rollout/logprob_abs_diff", "time/weight_sync"),
        timeout=240,
    )
    memory = {k: round(v, 2) for k, v in steps[-1].items() if k.startswith("memory/")}
    record(
        f"GRPO loop colocated on one GPU (SGLang rollout + {actor} actor)",
        steps=len(steps),
        reward_mean=[round(r["rollout/reward_mean"], 3) for r in steps],
        logprob_abs_diff=[round(r["rollout/logprob_abs_diff"], 5) for r in steps],
        time_weight_sync_s=[round(r["time/weight_sync"], 3) for r in steps],
        time_rollout_s=[round(r.get("time/rollout", float("nan")), 3) for r in steps],
        time_step_s=[round(r["time/step"], 3) for r in steps],
        last_step_memory_gib=memory,
    )
    # bf16 engine vs the actor on the same weights after every sync: a stale engine would drift
    assert max(r["rollout/logprob_abs_diff"] for r in steps) <= 5e-2
