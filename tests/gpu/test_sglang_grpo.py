"""The whole GRPO loop colocated on one GPU: SGLang rollout + torch actor through Ray, several
steps, with rewards, the rollout/actor logprob mismatch and time/weight_sync in TensorBoard.

Needs ray + sglang on the device (two back-to-back device calls; docs/sglang.md). The checkpoint is
RLINF_GPU_TINY (a warm-started GPU-tiny, built on the CPU machine and carried) or tiny://bootstrap-gpu.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_sglang_engine import record

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def test_grpo_loop_colocated_on_one_gpu(cuda, sglang_installed, tmp_path):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("needs ray (carry .wray on the device)")
    model = os.environ.get("RLINF_GPU_TINY", "tiny://bootstrap-gpu")
    log_dir = tmp_path / "logs"
    overrides = [
        "cluster.num_gpus_per_node=1",
        f"actor.model.model_path={model}",
        "actor.model.precision=fp32",
        "rollout.rollout_backend=sglang",
        "rollout.model.precision=bf16",
        "rollout.gpu_memory_utilization=0.3",
        "rollout.sglang.attention_backend=triton",
        "rollout.sglang.cuda_graph_max_bs=16",
        f"runner.max_steps={STEPS}",
        "runner.val_check_interval=0",
        "runner.save_interval=0",
        f"runner.output_dir={tmp_path / 'results'}",
        f"runner.logger.log_path={log_dir}",
        "runner.logger.plot=false",
    ]
    cmd = [sys.executable, str(ROOT / "examples/reasoning/main_grpo.py"), "tiny-moe-grpo-cpu", *overrides]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) >= 1 and "time/weight_sync" in r]
    assert len(steps) == STEPS, tail
    assert list(log_dir.glob("events.out.tfevents.*")), "no TensorBoard event file"
    for key in ("rollout/reward_mean", "rollout/logprob_abs_diff", "time/weight_sync"):
        assert all(key in r for r in steps), f"{key} missing: {sorted(steps[0])}"
    record(
        "GRPO loop colocated on one H200 (SGLang rollout + torch actor)",
        steps=len(steps),
        reward_mean=[round(r["rollout/reward_mean"], 3) for r in steps],
        logprob_abs_diff=[round(r["rollout/logprob_abs_diff"], 5) for r in steps],
        time_weight_sync_s=[round(r["time/weight_sync"], 3) for r in steps],
        time_rollout_s=[round(r.get("time/rollout", float("nan")), 3) for r in steps],
        time_step_s=[round(r["time/step"], 3) for r in steps],
    )
    # bf16 engine vs fp32 actor on the same weights after every sync: a stale engine would drift
    assert max(r["rollout/logprob_abs_diff"] for r in steps) <= 5e-2
