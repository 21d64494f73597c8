#!/usr/bin/env bash
# The SGLang rollout's GPU checks (docs/sglang.md, "GPU checks"; setup and the order of calls on a
# machine provisioned from wheel folders: tests/gpu/README.md):
#
#   bash tests/gpu/sglang_gpu_checks.sh engine        signatures, GPU-tiny logprobs / IPC weight update /
#                                                     memory hand-over / min_new_tokens, Moonlight-slice logprobs
#   bash tests/gpu/sglang_gpu_checks.sh engine+bench  the same, then benchmarks/rollout_decode.py with SGLang,
#                                                     the torch rollout and transformers' generate on the
#                                                     slice the tests built, batches 64/256 x 512 new tokens
#   bash tests/gpu/sglang_gpu_checks.sh loop [pytest args, e.g. -k megatron]
#                                                     the GRPO loop colocated on one GPU (Ray + SGLang
#                                                     rollout + torch or Megatron actor), 4 steps
#   bash tests/gpu/sglang_gpu_checks.sh sync          a Megatron actor and an SGLang engine on one GPU without
#                                                     Ray: CUDA IPC weight sync in the runner's memory order
#   bash tests/gpu/sglang_gpu_checks.sh export        a trained slice exported by rlinf.export_hf and served
#   bash tests/gpu/sglang_gpu_checks.sh step [args]   benchmarks/grpo_step_runner.py: a whole colocated
#                                                     step on the slice, split by phase
#   bash tests/gpu/sglang_gpu_checks.sh warm-start     the recipe's tiny://bootstrap-gpu warm start, built into
#                                                     this machine's cache as a user's first run builds it,
#                                                     in a call of its own (on the GPU, in a child process), so
#                                                     that each `curves` call trains for its whole budget
#   bash tests/gpu/sglang_gpu_checks.sh curves [SEEDS] [overrides]
#                                                     learning curves: the tiny-moe-grpo-gpu recipe through
#                                                     the runner (Megatron actor + SGLang rollout on one GPU),
#                                                     one run per seed (default 1234,1,2) and variant
#                                                     (CURVE_VARIANTS, default "megatron-te"; e.g.
#                                                     "megatron-te torch=actor.training_backend=torch,actor.model.precision=fp32"),
#                                                     side by side (benchmarks/learning_seeds.py)
#   bash tests/gpu/sglang_gpu_checks.sh depth27 [sweep|sweep2|sweep3|long|compile|partial|VARIANTS_JSON]
#                                                     rollout decode at Moonlight's full depth (27 layers,
#                                                     /tmp/m27, built when absent, ~3 min): the rollout's
#                                                     engine against each candidate setting in one run
#                                                     (sweep, sweep2, sweep3: DEPTH27_* below), or 2048 / 4096 new
#                                                     tokens at batch 256 with the tail of the step and
#                                                     4 oversampled groups cut by the quota (long), or
#                                                     torch.compile at batch 64 (compile), or
#                                                     data.partial_rollout's steps against plain ones
#                                                     (partial: benchmarks/partial_rollout_steps.py);
#                                                     carry .wfmla too (tests/gpu/flashmla_folder.sh) for
#                                                     the FlashMLA engine of sweep3
#
# Figures: JSON lines in $OUT/sglang_figures.jsonl (and on stdout).
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=${TMPDIR:-/tmp}  # scratch: checkpoints, logs, Ray sessions (run_all.sh side-by-side gives each part its own)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-$tmp/sglang-checks}
mkdir -p "$OUT"
export RLINF_GPU_FIGURES=$OUT/sglang_figures.jsonl RLINF_GPU_TEST_DIR=$tmp/rlinf-gpu-ckpt
PYTEST=(python3 -m pytest -q -s -p no:cacheprovider --durations=8)
status=0

source tests/gpu/provision.sh

# The tail of every non-empty Ray worker log (SGLang's children write their tracebacks there), in
# one archive: a call brings back only so many files, and the figures must not lose their place.
save_ray_logs() {
  local tails=$tmp/ray_log_tails
  rm -rf "$tails" && mkdir -p "$tails"
  for f in $tmp/ray/session_*/logs/worker-*.err $tmp/ray/session_*/logs/worker-*.out; do
    [ -s "$f" ] && tail -n 400 "$f" >"$tails/$(basename "$(dirname "$(dirname "$f")")")-$(basename "$f")"
  done
  tar czf "$OUT/ray_logs.tar.gz" -C "$tails" .
}

# Ray, Megatron and SGLang: installed, or from the wheel folders present (on top of an SGLang set an
# earlier `engine` run installed on this machine).
use_project_stack() {
  use_wheel_folders .wray .wmeg .whl2 || exit 1
  python3 -c "import sglang" || { echo "sglang is not importable: install.sh agentic, or run 'engine' first" >&2; exit 1; }
}

case "${1:-}" in
  engine|engine+bench)
    use_wheel_folders .whl || exit 1
    use_pytest || exit 1
    budget=560
    [ "$1" = engine+bench ] && budget=300
    timeout $budget "${PYTEST[@]}" tests/gpu/test_sglang_signatures.py tests/gpu/test_sglang_hooks_gpu.py \
      tests/gpu/test_sglang_engine_gpu.py tests/gpu/test_sglang_slice.py 2>&1 | tee "$OUT/pytest_engine.log" | tail -n 60
    status=${PIPESTATUS[0]}
    if [ "$1" = engine+bench ]; then
      # What else holds the GPU / host before the decode figures (the torch rollout ran 3-7x slower
      # after the engine tests than in a call of its own; docs/benchmarks.md)
      { nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; uptime; } 2>&1 |
        tee "$OUT/before_decode.txt"
      timeout 240 python3 -m benchmarks.rollout_decode --backends sglang,torch,generate --batches 64,256 \
        --new-tokens 512 --checkpoint "$RLINF_GPU_TEST_DIR/moonlight-slice-4l" \
        --sglang-profile $tmp/sglang-profile 2>&1 | tee "$OUT/rollout_decode.log" | tail -n 30
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
    fi
    ;;
  depth27)
    # One device call (600 s): install, the checkpoint if missing, then as many engines as fit
    # (the benchmark starts no engine that would end past its budget and names those it skipped).
    # Each engine: prompt 256 + 512 new, batches 64 and 256, medians of 3; the first engine is the
    # rollout's own (sglang_settings.engine_settings), every later one differs by one setting; sweep
    # also profiles the first engine's decode at both batches (kernel by kernel).
    use_wheel_folders .whl || exit 1
    if [ -f .wfmla/flashmla_ops.abi3.so.gz ]; then
      kernel_dir=$(python3 -c "import importlib.util as u; print(u.find_spec('sgl_kernel').submodule_search_locations[0])")
      gunzip -c .wfmla/flashmla_ops.abi3.so.gz >"$kernel_dir/flashmla_ops.abi3.so" && echo "FlashMLA extension put into $kernel_dir"
    fi
    ckpt=${DEPTH27_CHECKPOINT:-$tmp/m27}
    if [ ! -f "$ckpt/config.json" ]; then
      timeout 330 python3 -m rlinf.models.slice --out "$ckpt" --layers 27 --device cuda 2>&1 | tail -n 8 || exit 1
    fi
    plan=${2:-sweep}
    if [ "$plan" = partial ]; then  # data.partial_rollout against the plain step, 2048 new tokens,
      # PARTIAL_EXTRA_GROUPS (default 8) more groups in flight than trained
      timeout $((585 - SECONDS)) python3 -m benchmarks.partial_rollout_steps --checkpoint "$ckpt" --batch 256 \
        --max-new-tokens 2048 --oversample-groups "${PARTIAL_EXTRA_GROUPS:-8}" --steps 4 >"$OUT/depth27_partial.json" 2>"$OUT/depth27_partial.log"
      status=$?
      grep -E '^\{"step"|Error' "$OUT/depth27_partial.log" | cut -c1-700 | tail -n 10
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: v for k, v in d.items() if k != 'steps'})" \
        "$OUT/depth27_partial.json" 2>/dev/null
      exit $status
    fi
    # triton_decode: the rollout's engine without its measured flashinfer decode (MEASURED_ENGINE_ARGS)
    triton_decode='{"decode_attention_backend": null, "prefill_attention_backend": null}'
    DEPTH27_sweep='{"generic_moe": {"env": {"SGLANG_MOE_CONFIG_DIR": null}}, "triton_decode": '$triton_decode',
      "no_overlap": {"disable_overlap_schedule": true}}'
    # (num_continuous_decode_steps is not a candidate: SGLang 0.5.12 parses it and never reads it)
    DEPTH27_sweep2='{"flashinfer_sampling": {"sampling_backend": "flashinfer"}, "no_cuda_graph": {"disable_cuda_graph": true},
      "chunked_prefill_32k": {"chunked_prefill_size": 32768}}'
    # FlashMLA decode (the rollout's choice before flashinfer's MLA decode measured faster); carry
    # .wfmla, else the benchmark lists it under sglang_variant_unavailable. (SGLang's shared-experts
    # fusion, enforce_shared_experts_fusion, is no candidate: 0.5.12's DeepSeek weight loader asserts
    # a single shared expert, and Moonlight has 2.)
    DEPTH27_sweep3='{"flashmla_decode": {"decode_attention_backend": "flashmla"}}'
    # CUDA graphs captured at the measured batches only: the decode steps run the same graphs as
    # with the rollout's full list, and each engine starts in less of the call's time.
    extra=(--batches 64,256 --new-tokens 512 --sglang-repeats 3 --sglang-arg 'cuda_graph_bs=[64,256]')
    case $plan in
      sweep) variants=$DEPTH27_sweep; extra+=(--sglang-profile $tmp/sglang-profile-27) ;;
      sweep2) variants=$DEPTH27_sweep2 ;;
      sweep3) variants=$DEPTH27_sweep3 ;;
      long) variants='{}'; extra=(--batches 256 --tail-lengths 2048,4096 --oversample-groups 4) ;;
      compile)  # SGLang's torch.compile of the decode graphs at batch 64 (inductor's default mode)
        variants='{"torch_compile": {"enable_torch_compile": true, "torch_compile_max_bs": 64,
          "env": {"SGLANG_TORCH_COMPILE_MODE": "default"}}}'
        extra=(--batches 64 --new-tokens 512 --sglang-repeats 3 --sglang-arg 'cuda_graph_bs=[64,256]') ;;
      *) variants=$plan; plan=custom ;;
    esac
    left=$((585 - SECONDS))
    timeout "$left" python3 -m benchmarks.rollout_decode --backends sglang --layers 27 --checkpoint "$ckpt" \
      --sglang-mem-fraction 0.7 "${extra[@]}" --sglang-variants "$variants" --time-budget-s $((left - 25)) \
      --rows "$OUT/depth27_${plan}_rows.jsonl" >"$OUT/depth27_$plan.json" 2>"$OUT/depth27_$plan.log"
    status=$?
    grep -E "^\{'(backend|tail)'|variant|Error" "$OUT/depth27_$plan.log" | cut -c1-400 | tail -n 30
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ('layers', 'weight_read_per_step_GiB', 'sglang_variant_unavailable', 'sglang_variants_not_run', 'sglang_variant_errors')})" "$OUT/depth27_$plan.json" 2>/dev/null
    ;;
  loop)
    use_project_stack
    use_pytest || exit 1
    use_tiny_checkpoint .h11-tiny
    # FRESH_KERNEL_CACHES=1: this run compiles its triton / inductor kernels anew (the diagnostic for
    # the engine fault that follows the order of runs on a machine; docs/sglang.md)
    if [ "${FRESH_KERNEL_CACHES:-0}" = 1 ]; then
      export TRITON_CACHE_DIR=$(mktemp -d $tmp/triton-cache.XXXX) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d $tmp/inductor-cache.XXXX)
    fi
    timeout 560 "${PYTEST[@]}" \
      tests/gpu/test_sglang_grpo.py "${@:2}" 2>&1 | tee "$OUT/pytest_loop.log" | tail -n 60
    status=${PIPESTATUS[0]}
    save_ray_logs
    ;;
  sync)
    use_project_stack
    use_pytest || exit 1
    use_tiny_checkpoint .h11-tiny
    timeout 560 "${PYTEST[@]}" tests/gpu/test_sglang_megatron_sync.py \
      2>&1 | tee "$OUT/pytest_sync.log" | tail -n 60
    status=${PIPESTATUS[0]}
    ;;
  export)
    # The checkpoint it writes (weights + optimizer state, ~35 GB) is deleted after the export, and
    # pytest keeps a failed test's folder only.
    use_project_stack
    use_pytest || exit 1
    df -h "$tmp" | tail -n 1
    timeout 560 "${PYTEST[@]}" -o tmp_path_retention_policy=failed \
      tests/gpu/test_hf_export_gpu.py 2>&1 | tee "$OUT/pytest_export.log" | tail -n 60
    status=${PIPESTATUS[0]}
    ;;
  step)
    # A whole colocated GRPO step on the slice through the runner (SGLang + Megatron by default);
    # extra args go to the benchmark, e.g. --actor torch, --sweep-new-tokens 256,1024 --plot ...,
    # --staleness 0,1 (runner.max_staleness, both roles resident)
    # The work dir stays off $OUT (checkpoints, if any, are tens of GB); rows.jsonl, each run's log
    # and metrics come back. STEP_TIMEOUT (default 560) bounds the whole call, STEP_TAG names it.
    # `--override cluster.cuda_mps=true`: the runs under the run's own CUDA MPS daemon (docs/rollout.md).
    use_project_stack
    work=$tmp/step-work${STEP_TAG:+-$STEP_TAG} limit=${STEP_TIMEOUT:-560}
    rm -f "$work/rows.jsonl"  # this call's rows only
    timeout "$limit" python3 -m benchmarks.grpo_step_runner --work-dir "$work" --timeout $((limit - 60)) "${@:2}" 2>&1 |
      tee "$OUT/grpo_step_runner${STEP_TAG:+-$STEP_TAG}.log" | tail -n 40
    status=${PIPESTATUS[0]}
    for d in "$work"/*/; do
      mkdir -p "$OUT/step${STEP_TAG:+-$STEP_TAG}/$(basename "$d")"
      cp -f "$d/run.log" "$d/logs/metrics.jsonl" "$d/logs/megatron_spec.json" "$OUT/step${STEP_TAG:+-$STEP_TAG}/$(basename "$d")/" 2>/dev/null
    done
    cp -f "$work/rows.jsonl" "$OUT/step${STEP_TAG:+-$STEP_TAG}/" 2>/dev/null
    save_ray_logs
    ;;
  warm-start)
    use_project_stack
    timeout 580 python3 -c "from rlinf.models.tiny import TINY_GPU_URI, resolve_model_path as r; print(r(TINY_GPU_URI))"
    status=$?
    ;;
  curves)
    # CURVE_PARALLEL: runs at once (default 3 a GPU).
    # Each run's metrics.jsonl, resolved config and log come back under $OUT/curves/<variant>-s<seed>,
    # with summary.json (gains per run and per variant) and learning.png; CURVE_TIMEOUT (default 570)
    # bounds the call (runs still going then are cut off; the validations they logged come back).
    # No carried checkpoint: the recipe's tiny://bootstrap-gpu warm start is built into the cache
    # once (or by `warm-start` in an earlier call), as a user's first run builds it.
    use_project_stack
    work=$tmp/curves limit=${CURVE_TIMEOUT:-570}
    rm -rf "$work" && mkdir -p "$OUT/curves"
    variants=()
    for v in ${CURVE_VARIANTS:-megatron-te}; do variants+=(--variant "$v"); done
    timeout "$limit" python3 -m benchmarks.learning_seeds tiny-moe-grpo-gpu --seeds "${2:-1234,1,2}" "${variants[@]}" \
      ${CURVE_PARALLEL:+--parallel "$CURVE_PARALLEL"} \
      --out "$work" --timeout $((limit - 30)) --plot "$OUT/curves/learning.png" "${@:3}" \
      >"$OUT/curves/summary.json" 2>"$OUT/curves/progress.log"
    status=$?
    tail -n 40 "$OUT/curves/progress.log"
    python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['variants'], indent=1))" "$OUT/curves/summary.json"
    for d in "$work"/*/; do
      mkdir -p "$OUT/curves/$(basename "$d")"
      cp -f "$d"/run.log "$d"/logs/*.jsonl "$d"/logs/*.yaml "$d"/logs/*.json "$OUT/curves/$(basename "$d")/" 2>/dev/null
    done
    save_ray_logs
    ;;
  *)
    echo "usage: $0 engine|engine+bench|depth27|loop|sync|export|step|warm-start|curves" >&2
    exit 2
    ;;
esac
cp -f "$RLINF_GPU_FIGURES" "$OUT/" 2>/dev/null
cat "$RLINF_GPU_FIGURES" 2>/dev/null
exit "$status"  # the checks' own status (pytest's, the benchmark's), not the last cat's
