"""tests/gpu/run_all.sh side-by-side: every suite once, each alone on its GPU, with its own scratch
folder and port, and one merged summary. The real script, in a copy of the repo whose two check
scripts are stand-ins that log where they ran (no GPU here); nvidia-smi is a stand-in listing GPUs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

GPU_DIR = Path(__file__).parents[1] / "gpu"
SUITES = "engine megatron-actor optim megatron-grpo pack grouped-experts cuda-graphs sync hf-export loop step routing-replay-step".split()

STAND_IN = """#!/usr/bin/env bash
echo "$(date +%s.%N) start $CUDA_VISIBLE_DEVICES $TMPDIR $MASTER_PORT $RLINF_KITS_READY $*" >> "$LEDGER"
sleep 0.4
echo "$(date +%s.%N) end $CUDA_VISIBLE_DEVICES $TMPDIR" >> "$LEDGER"
echo "1 passed in 0.40s"
"""


def _fake_repo(root: Path, gpus: int) -> dict[str, str]:
    (root / "tests/gpu").mkdir(parents=True)
    for name in ("run_all.sh", "run_all_summary.py", "provision.sh"):
        shutil.copy(GPU_DIR / name, root / "tests/gpu" / name)
    for name in ("run_megatron_checks.sh", "sglang_gpu_checks.sh"):
        (root / "tests/gpu" / name).write_text(STAND_IN)
    (root / "bin").mkdir()
    smi = root / "bin/nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n" + "".join(f'echo "GPU {g}: NVIDIA H200 (UUID: GPU-{g})"\n' for g in range(gpus))
    )
    smi.chmod(0o755)
    path = f"{root / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin"  # this test's python3
    return {
        "PATH": path,
        "LEDGER": str(root / "ledger"),
        "TMPDIR": str(root / "tmp"),
        "OUT": str(root / "out"),
    }


def _run(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    (root / "tmp").mkdir(exist_ok=True)
    return subprocess.run(
        ["bash", str(root / "tests/gpu/run_all.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _most_at_once(ledger: Path, gpu: str) -> int:
    """The most suites that ran on `gpu` at one time, from the stand-ins' start/end lines."""
    events = []
    for line in ledger.read_text().splitlines():
        when, kind, on, *_ = line.split()
        if on == gpu:
            events.append((float(when), 1 if kind == "start" else -1))
    running = most = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at one instant
        running += step
        most = max(most, running)
    return most


def test_side_by_side_runs_each_suite_once_alone_on_its_gpu_and_merges_one_summary(tmp_path):
    env = _fake_repo(tmp_path, gpus=3)
    done = _run(tmp_path, env, "side-by-side")
    assert done.returncode == 0, done.stdout + done.stderr
    starts = {}  # scratch folder: (port, kits flag)
    for line in (tmp_path / "ledger").read_text().splitlines():
        if line.split()[1] == "start":
            _, _, _, scratch, port, kits, *_ = line.split()
            starts[scratch] = (port, kits)
    assert sorted(Path(s).name for s in starts) == sorted(f"gpu-{name}" for name in SUITES)
    assert {kits for _, kits in starts.values()} == {"1"}  # the kits were installed once, before
    assert len({port for port, _ in starts.values()}) == len(SUITES)  # a port each
    for gpu in "012":  # each GPU used, never by two suites at once
        assert _most_at_once(tmp_path / "ledger", gpu) == 1
    whole = json.loads((tmp_path / "out/run_all_summary.json").read_text())
    assert [s["suite"] for s in whole["suites"]] == SUITES and whole["missing"] == whole["not_green"] == []
    assert whole["totals"]["passed"] == len(SUITES) and whole["code"] == whole["suites"][0]["code"]


def test_side_by_side_of_some_parts_judges_those_names_the_rest_and_refuses_one_gpu(tmp_path):
    env = _fake_repo(tmp_path, gpus=2)
    done = _run(tmp_path, env, "side-by-side", "engine", "step", "replay")
    assert done.returncode == 0, done.stdout + done.stderr  # the suites that ran are green
    whole = json.loads((tmp_path / "out/run_all_summary.json").read_text())
    assert [s["suite"] for s in whole["suites"]] == ["engine", "step", "routing-replay-step"]
    assert "loop" in whole["missing"]  # ... and the rest are named: not run_all green
    (tmp_path / "tests/gpu/sglang_gpu_checks.sh").write_text(STAND_IN.replace("1 passed", "1 failed"))
    shutil.rmtree(tmp_path / "out")
    assert _run(tmp_path, env, "side-by-side", "engine").returncode == 1
    (tmp_path / "tests/gpu/sglang_gpu_checks.sh").write_text("#!/usr/bin/env bash\nkill -9 $PPID\n")
    shutil.rmtree(tmp_path / "out")  # a suite whose run_all dies leaves no summary: it is missing, red
    assert _run(tmp_path, env, "side-by-side", "engine", "optim").returncode == 1
    wrong = _run(tmp_path, env, "side-by-side", "enigne")
    assert wrong.returncode == 2 and "enigne is neither a part nor a suite" in wrong.stderr
    one = tmp_path / "one"
    refused = _run(one, _fake_repo(one, gpus=1), "side-by-side")
    assert refused.returncode == 2 and "needs two or more GPUs, this machine shows 1" in refused.stderr


def test_a_suite_runs_alone_by_name_and_an_unknown_part_is_refused(tmp_path):
    env = _fake_repo(tmp_path, gpus=1)
    assert _run(tmp_path, env, "optim").returncode == 0
    assert [
        json.loads(line)["suite"]
        for line in (tmp_path / "tmp/rlinf-gpu-run-all.jsonl").read_text().splitlines()
    ] == ["optim"]
    wrong = _run(tmp_path, env, "optimm")
    assert wrong.returncode == 2 and "usage:" in wrong.stderr


def test_suites_per_gpu_shares_one_gpu_among_the_suites_that_can_and_refuses_the_others(tmp_path):
    env = _fake_repo(tmp_path, gpus=1)
    done = _run(tmp_path, {**env, "SUITES_PER_GPU": "2"}, "side-by-side", "actor", "pack")
    assert done.returncode == 0, done.stdout + done.stderr
    whole = json.loads((tmp_path / "out/run_all_summary.json").read_text())
    shared = ["megatron-actor", "optim", "megatron-grpo", "pack", "grouped-experts"]
    assert [s["suite"] for s in whole["suites"]] == shared and whole["not_green"] == []
    assert _most_at_once(tmp_path / "ledger", "0") == 2  # two at a time on GPU 0, never three
    for refused_part, per_gpu, why in (
        ("engine", "2", "engine cannot share a GPU (SUITES_PER_GPU=2)"),
        ("graphs", "3", "cuda-graphs cannot share a GPU (SUITES_PER_GPU=3)"),
        ("optim", "0", "SUITES_PER_GPU=0 is not a whole number >= 1"),
    ):
        refused = _run(tmp_path, {**env, "SUITES_PER_GPU": per_gpu}, "side-by-side", refused_part)
        assert refused.returncode == 2 and why in refused.stderr, refused.stderr
