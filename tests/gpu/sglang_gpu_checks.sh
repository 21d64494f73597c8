#!/usr/bin/env bash
# The SGLang rollout's GPU checks on a lent H200 (docs/sglang.md, "GPU checks"). Two device calls,
# the second within 30 s of the first (ray and sglang never fit one call's 64 MiB carry):
#
#   1. carry [".whl", ".h10-pytest"]:                   bash tests/gpu/sglang_gpu_checks.sh engine
#      installs sglang, then: signatures, GPU-tiny logprobs / IPC weight update / memory hand-over /
#      min_new_tokens, Moonlight-slice logprobs
#      (engine+bench: the same, then benchmarks/rollout_decode.py with SGLang, the torch rollout and
#      transformers' generate on the slice the tests built, batches 64/256 x 512 new tokens)
#   2. carry [".wray", ".wmeg", ".h10-pytest", ".h10-tiny"]: bash tests/gpu/sglang_gpu_checks.sh loop [pytest args, e.g. -k megatron]
#      the GRPO loop colocated on one GPU (Ray + SGLang rollout + torch actor), 4 steps
#
#   3. (like 2, carry [".wray", ".wmeg"]):              bash tests/gpu/sglang_gpu_checks.sh step [args]
#      benchmarks/grpo_step_runner.py: a whole colocated step on the slice, split by phase
#
# .wray and .wmeg are ../shared/device/prepare.sh's .whl2 split in two (megatron-* wheels in .wmeg, the
# rest in .wray), each with a copy of .whl2/tools:
#   mkdir -p .wray .wmeg && cp -r .whl2/tools .wray/ && cp -r .whl2/tools .wmeg/ &&
#   for f in .whl2/*.whl; do case ${f##*/} in megatron*) cp "$f" .wmeg/ ;; *) cp "$f" .wray/ ;; esac; done
# .h10-pytest holds pytest/pluggy/iniconfig wheels (the device image has no pytest); .h10-tiny is a
# warm-started GPU-tiny checkpoint built on the CPU machine:
#   python -c "from rlinf.models.slice import GPU_TINY_SETTINGS as S; from rlinf.models.tiny import \
#     build_tiny_checkpoint as b; b('.h10-tiny', S)"
# Figures: JSON lines in $OUT/sglang_figures.jsonl (and on stdout).
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/sglang-checks}
mkdir -p "$OUT"
export RLINF_GPU_FIGURES=$OUT/sglang_figures.jsonl RLINF_GPU_TEST_DIR=/tmp/rlinf-gpu-ckpt
status=0

use_pytest() {
  if ! python3 -c "import pytest" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site/pytest .h10-pytest/*.whl 2>/dev/null ||
      [ -d /tmp/site/pytest ] || { echo "no pytest: carry .h10-pytest" >&2; exit 1; }
    export PYTHONPATH=/tmp/site/pytest${PYTHONPATH:+:$PYTHONPATH}
  fi
}

# The tail of every non-empty Ray worker log (SGLang's children write their tracebacks there), in
# one archive: a call brings back only so many files, and the figures must not lose their place.
save_ray_logs() {
  local tails=/tmp/ray_log_tails
  rm -rf "$tails" && mkdir -p "$tails"
  for f in /tmp/ray/session_*/logs/worker-*.err /tmp/ray/session_*/logs/worker-*.out; do
    [ -s "$f" ] && tail -n 400 "$f" >"$tails/$(basename "$(dirname "$(dirname "$f")")")-$(basename "$f")"
  done
  tar czf "$OUT/ray_logs.tar.gz" -C "$tails" .
}

# Ray + Megatron from this call's carry, on top of the sglang the previous call installed.
use_project_stack() {
  source .wray/tools/install.sh >/dev/null && source .wmeg/tools/install.sh >/dev/null || exit 1
  source /tmp/site/env.sh
  python3 -c "import sglang" || { echo "sglang not installed: run the engine call first (30 s)"; exit 1; }
}

case "${1:-}" in
  engine|engine+bench)
    bash .whl/tools/install.sh >/dev/null || exit 1
    source /tmp/site/env.sh
    use_pytest
    budget=560
    [ "$1" = engine+bench ] && budget=300
    timeout $budget python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_sglang_signatures.py tests/gpu/test_sglang_hooks_gpu.py \
      tests/gpu/test_sglang_engine_gpu.py tests/gpu/test_sglang_slice.py 2>&1 | tee "$OUT/pytest_engine.log" | tail -n 60
    status=${PIPESTATUS[0]}
    if [ "$1" = engine+bench ]; then
      # What else holds the GPU / host before the decode figures (the torch rollout ran 3-7x slower
      # after the engine tests than in a call of its own; docs/benchmarks.md)
      { nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; uptime; } 2>&1 |
        tee "$OUT/before_decode.txt"
      timeout 240 python3 benchmarks/rollout_decode.py --backends sglang,torch,generate --batches 64,256 \
        --new-tokens 512 --checkpoint "$RLINF_GPU_TEST_DIR/moonlight-slice-4l" \
        --sglang-profile /tmp/sglang-profile 2>&1 | tee "$OUT/rollout_decode.log" | tail -n 30
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
    fi
    ;;
  loop)
    use_project_stack
    use_pytest
    # FRESH_KERNEL_CACHES=1: this run compiles its triton / inductor kernels anew (the diagnostic for
    # the engine fault that follows the order of runs on a machine; docs/sglang.md)
    if [ "${FRESH_KERNEL_CACHES:-0}" = 1 ]; then
      export TRITON_CACHE_DIR=$(mktemp -d /tmp/triton-cache.XXXX) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/inductor-cache.XXXX)
    fi
    RLINF_GPU_TINY=$PWD/.h10-tiny timeout 560 python3 -m pytest -q -s -p no:cacheprovider \
      tests/gpu/test_sglang_grpo.py "${@:2}" 2>&1 | tee "$OUT/pytest_loop.log" | tail -n 60
    status=${PIPESTATUS[0]}
    save_ray_logs
    ;;
  step)
    # A whole colocated GRPO step on the slice through the runner (SGLang + Megatron by default);
    # extra args go to the benchmark, e.g. --actor torch, --sweep-new-tokens 256,1024 --plot ...
    # The work dir stays off $OUT (checkpoints, if any, are tens of GB); rows.jsonl, each run's log
    # and metrics come back. STEP_TIMEOUT (default 560) bounds the whole call, STEP_TAG names it.
    use_project_stack
    work=/tmp/step-work${STEP_TAG:+-$STEP_TAG} limit=${STEP_TIMEOUT:-560}
    timeout "$limit" python3 benchmarks/grpo_step_runner.py --work-dir "$work" --timeout $((limit - 60)) "${@:2}" 2>&1 |
      tee "$OUT/grpo_step_runner${STEP_TAG:+-$STEP_TAG}.log" | tail -n 40
    status=${PIPESTATUS[0]}
    for d in "$work"/*/; do
      mkdir -p "$OUT/step${STEP_TAG:+-$STEP_TAG}/$(basename "$d")"
      cp -f "$d/run.log" "$d/logs/metrics.jsonl" "$OUT/step${STEP_TAG:+-$STEP_TAG}/$(basename "$d")/" 2>/dev/null
    done
    cp -f "$work/rows.jsonl" "$OUT/step${STEP_TAG:+-$STEP_TAG}/" 2>/dev/null
    save_ray_logs
    ;;
  *)
    echo "usage: $0 engine|engine+bench|loop|step" >&2
    exit 2
    ;;
esac
cp -f "$RLINF_GPU_FIGURES" "$OUT/" 2>/dev/null
cat "$RLINF_GPU_FIGURES" 2>/dev/null
exit "$status"  # the checks' own status (pytest's, the benchmark's), not the last cat's
