#!/usr/bin/env bash
# The Megatron actor's GPU checks (docs/megatron.md, "GPU checks"; setup: tests/gpu/README.md):
#
#   bash tests/gpu/run_megatron_checks.sh [smoke|actor|te-free-spec|grpo|bench|optim|resume|pack|grouped|experts|te-experts|graphs|graph-replays|host|bf16-ops|rank-emulation|all] [args]
#   (default: all; `actor` passes args to pytest, `bench` to the benchmark)
#
# Each runs the spec this machine offers: Transformer Engine's when TE is importable (e.g. the .wte
# wheel folder, tests/gpu/README.md), else the TE-free one; RLINF_MEGATRON_TE=off forces the latter.
#
#   smoke  GPU-tiny fp32: logprobs vs HF, export, one minibatch vs the torch actor
#   actor  tests/gpu/test_megatron_actor.py (GPU-tiny and the 4-layer Moonlight slice) and
#          test_fused_logprobs_gpu.py (the logprob kernels), then benchmarks/logprob_kernels.py
#   te-free-spec  (not in `all`) with TE installed: the spec test again under RLINF_MEGATRON_TE=off
#   grpo   tests/gpu/test_megatron_grpo.py: GRPO steps through the runner (Ray, torch rollout)
#   bench  benchmarks/actor_throughput.py on the Moonlight slice (Megatron vs HF actor; with TE e.g.
#          --backends torch,megatron,megatron-te-free --megatron-variants gradient_accumulation_fusion=false;
#          TE's core attention kernel, one per process: --megatron-setting attention_backend=unfused)
#   optim  the precision-aware optimizer (bf16 moments: TE's FusedAdam, or CompactAdamW without TE):
#          tests/gpu/test_megatron_compact_adamw.py, then save / load (same actor, and a fresh one)
#          with fp32 and bf16 moments
#   resume the save / load half of optim alone
#   pack   actor.pack_sequences on the Megatron actor: packed vs padded logprobs (GPU-tiny), then
#          benchmarks/packed_micro_batches.py on the slice, Megatron then torch (varied lengths)
#   grouped  actor.model.moe_grouped_gemm (rlinf's grouped-GEMM experts, not in `all`): the slice
#          benchmark, HF vs Megatron with grouped-GEMM experts (profiled), then
#          tests/gpu/test_megatron_grouped_experts.py, then Megatron with SequentialMLP experts
#   experts  (not in `all`) tests/gpu/test_megatron_grouped_experts.py alone (rlinf's grouped-GEMM experts
#          in the spec this machine runs)
#   te-experts  (not in `all`; needs TE) actor.model.moe_grouped_gemm_impl: torch, rlinf's grouped_mm
#          experts in the TE spec: one slice benchmark with HF, Megatron-TE with TEGroupedMLP and
#          Megatron-TE with rlinf's experts (`bench --backends torch,megatron --megatron-variants
#          moe_grouped_gemm_impl=torch`, profiled); `experts` runs their checks
#   graphs (not in `all`; needs TE) actor.model.cuda_graph_impl: transformer_engine, the per-layer CUDA
#          graphs of the train pass: tests/gpu/test_megatron_cuda_graphs.py (graphed vs eager from the
#          same weights, GPU-tiny and the slice, padded and packed; its own pytest process), then one
#          slice benchmark, HF, Megatron-TE eager and graphed in one process, profiled (`bench
#          --backends torch,megatron --megatron-variants cuda_graph_impl=transformer_engine`; GPU
#          busy / idle / kernels of each). The emulated TP=8/EP=8 rank with graphs: `rank-emulation
#          --megatron-setting cuda_graph_impl=transformer_engine`
#   graph-replays  (not in `all`; needs TE) tests/gpu/test_megatron_graph_replays.py: eager twice and
#          graphed four times from the same weights after each of four train calls (slice), one
#          process per variant, each about 90 s (under a 10-minute command limit, name three a
#          call). Arguments pick variants, VARIANT[:ENV=VALUE] (kernels, chunked, synced,
#          synced-before, synced-after; the knobs in the test's docstring), e.g.
#          `graph-replays kernels kernels:RLINF_REPLAY_DTOH=current kernels:RLINF_REPLAY_GROUPED_GEMM=serial`.
#          Without arguments: the Triton kernels with the in-process rotation (RLINF_REPLAY_ROTATE=1:
#          as shipped, then megatron's dispatcher side stream, TE's multi-stream expert GEMMs, the
#          syncs around every replay and TE's shared graph buffers each taken out in turn, 16
#          graphed passes each), then one process each for cuDNN's deterministic attention
#          backward, unfused core attention and the MLA RoPE fusion off, then the chunked torch
#          path. Every pass's gradient difference, with each differing parameter, goes to the
#          figures.
#   bf16-ops  (not in `all`) tests/gpu/bf16_op_errors.py: the bf16 forward against HF's, op by op on
#          GPU-tiny, and the logprob figure of `actor` with each TE fusion switched off in turn
#   host   (not in `all`) the grouped-experts benchmark with a host profile (--profile-host: top host
#          ops, where device->host syncs come from), then both actors at one 16384-token micro-batch
#   rank-emulation  (not in `all`) one rank of moonlight-16b-grpo-megatron (TP=8, EP=8, ETP=1, SP) on
#          this GPU, collectives left out (benchmarks/rank_emulation.py): the full-size rank (27
#          layers, random weights from the Moonlight config), 8 micro-batches of 1 x 9216 tokens a
#          train call (logprob pass: 4 sequences a forward, as the recipe), profiled; JSON with the
#          train-call span, GPU busy share, kernels, TFLOP/s and `prediction`, the recipe's per-GPU
#          actor seconds per step (docs/moonlight.md, section 6); --megatron-variants adds emulated
#          actors to the same run, e.g. rlinf's grouped_mm experts against TEGroupedMLP:
#          `rank-emulation --megatron-setting cuda_graph_impl=transformer_engine
#          --megatron-variants "moe_grouped_gemm_impl=torch,moe_grouped_gemm_impl=torch;micro_batch_size=4"`
#
# CHECKS_ONLY=1 (as run_all.sh runs them): actor, pack and graphs run their checks without the
# benchmarks that follow them; those keep their figures in docs/benchmarks.md through these commands.
#
# Figures: JSON lines in $OUT/megatron_figures.jsonl (and on stdout).
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=${TMPDIR:-/tmp}  # scratch: checkpoints, logs, Ray sessions (run_all.sh side-by-side gives each part its own)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
# Exact fp32 GEMMs under Transformer Engine, as the runner starts an fp32 actor's processes
# (rlinf.models.megatron.fp32_gemms); bf16 GEMMs are unaffected.
export NVIDIA_TF32_OVERRIDE=0
OUT=${OUT:-$tmp/megatron-checks}
mkdir -p "$OUT"
export RLINF_GPU_FIGURES=$OUT/megatron_figures.jsonl RLINF_GPU_TEST_DIR=$tmp/rlinf-gpu-ckpt
source tests/gpu/provision.sh
use_tiny_checkpoint .h11-tiny
use_wheel_folders .wte .wray .wmeg .whl2 || exit 1
use_pytest || exit 1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PYTEST=(python3 -m pytest -q -s -p no:cacheprovider --show-capture=no --durations=8 -W ignore::DeprecationWarning -W ignore::UserWarning)
status=0
# A failing check sets status even inside a pipeline (`run ... | tail`, a subshell): it leaves a mark.
failed=$tmp/megatron-checks-failed.$$
run() { echo "== $*"; "$@" || { status=1; touch "$failed"; }; }
benchmarks_too() { [ "${CHECKS_ONLY:-0}" != 1 ]; }
slice=$RLINF_GPU_TEST_DIR/moonlight-slice-4l
grouped_experts_tests() {  # SECONDS: tests/gpu/test_megatron_grouped_experts.py within that time
  run timeout "$1" "${PYTEST[@]}" tests/gpu/test_megatron_grouped_experts.py 2>&1 | grep -v "^  \|^$" | tail -n 40
}
bench() {  # extra benchmarks/actor_throughput.py arguments
  [ -f "$slice/slice_build.json" ] || python3 -m rlinf.models.slice --out "$slice" --layers 4 --device cuda
  run timeout "${BENCH_TIMEOUT:-300}" python3 -m benchmarks.actor_throughput --model "$slice" --rows 16 --micro-batch 8 --prompt 256 \
    --response 768 --steps 2 "$@" | tee -a "$RLINF_GPU_FIGURES"
}

mode=${1:-all}
case "$mode" in
  smoke) run timeout 300 "${PYTEST[@]}" tests/gpu/test_megatron_actor.py \
           -k "(gpu_tiny and fp32) or export and gpu_tiny or torch_actor" 2>&1 | tail -n 60 ;;
  actor|all) run timeout "${ACTOR_TIMEOUT:-420}" "${PYTEST[@]}" tests/gpu/test_megatron_actor.py tests/gpu/test_fused_logprobs_gpu.py \
    "${@:2}" 2>&1 | grep -v "^  \|^$" | tail -n 40
    benchmarks_too && run timeout 180 python3 -m benchmarks.logprob_kernels | tee -a "$RLINF_GPU_FIGURES" ;;&
  te-free-spec) run env RLINF_MEGATRON_TE=off timeout 120 "${PYTEST[@]}" tests/gpu/test_megatron_actor.py -k spec 2>&1 | tail -n 20 ;;
  grpo|all) run timeout 300 "${PYTEST[@]}" tests/gpu/test_megatron_grpo.py 2>&1 | tail -n 40 ;;&
  bench|all) bench --profile $tmp/actor-profile "${@:2}" ;;
  grouped)
    # HF (torch actor) and Megatron with grouped experts in one run, then the checks, then
    # SequentialMLP experts for the before/after
    bench --megatron-grouped-gemm --profile $tmp/actor-profile-grouped
    grouped_experts_tests 200
    bench --backends megatron ;;
  experts) grouped_experts_tests 300 ;;
  te-experts)  # the benchmark alone: `experts` (run_all's grouped-experts suite) runs the checks under TE
    python3 -c "import transformer_engine.pytorch" || { echo "te-experts needs Transformer Engine (.wte)" >&2; exit 1; }
    BENCH_TIMEOUT=${BENCH_TIMEOUT:-540} bench --backends torch,megatron --megatron-variants moe_grouped_gemm_impl=torch \
      --profile $tmp/actor-profile-te-experts "${@:2}" ;;
  host)
    bench --megatron-grouped-gemm --profile $tmp/actor-profile-host --profile-host
    bench --megatron-grouped-gemm --micro-batch 16 ;;
  bf16-ops) run timeout 400 python3 tests/gpu/bf16_op_errors.py "${@:2}" 2>&1 | tee "$OUT/bf16_ops.log" | grep -E '^\{|Error' | tee -a "$RLINF_GPU_FIGURES" ;;
  optim) run timeout 420 "${PYTEST[@]}" tests/gpu/test_megatron_compact_adamw.py 2>&1 | grep -v "^  \|^$" | tail -n 40 ;;&
  optim|resume)
    run timeout 150 "${PYTEST[@]}" tests/gpu/test_megatron_actor.py -k "save_load or fresh_actor" 2>&1 | grep -v "^  \|^$" | tail -n 40 ;;
  pack)
    run timeout 150 "${PYTEST[@]}" tests/gpu/test_megatron_actor.py -k packed 2>&1 | grep -v "^  \|^$" | tail -n 20
    if benchmarks_too; then
      [ -f "$slice/slice_build.json" ] || python3 -m rlinf.models.slice --out "$slice" --layers 4 --device cuda
      for backend in megatron torch; do
        run timeout 200 python3 -m benchmarks.packed_micro_batches --model "$slice" --backend $backend --precision bf16 \
          --rows 64 --prompt 256 --response 768 --budget 16384 | tee -a "$RLINF_GPU_FIGURES"
      done
    fi ;;
  graphs)
    python3 -c "import transformer_engine.pytorch" || { echo "graphs needs Transformer Engine (.wte)" >&2; exit 1; }
    run timeout "${GRAPHS_TIMEOUT:-300}" "${PYTEST[@]}" tests/gpu/test_megatron_cuda_graphs.py 2>&1 | grep -v "^  \|^$" | tail -n 40
    if benchmarks_too; then
      BENCH_TIMEOUT=${BENCH_TIMEOUT:-360} bench --backends torch,megatron --megatron-variants cuda_graph_impl=transformer_engine \
        --profile $tmp/actor-profile-graphs "${@:2}"
    fi ;;
  graph-replays)
    python3 -c "import transformer_engine.pytorch" || { echo "graph-replays needs Transformer Engine (.wte)" >&2; exit 1; }
    variants=("${@:2}")
    [ ${#variants[@]} -gt 0 ] || variants=(kernels:RLINF_REPLAY_ROTATE=1 kernels:NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
      kernels:RLINF_REPLAY_SETTINGS=attention_backend=unfused kernels:RLINF_REPLAY_SETTINGS=apply_rope_fusion=false
      chunked)
    for variant in "${variants[@]}"; do
      extra=(); [[ $variant == *:* ]] && extra=("${variant#*:}")
      run env RLINF_REPLAY_VARIANT="${variant%%:*}" "${extra[@]}" timeout 300 "${PYTEST[@]}" \
        tests/gpu/test_megatron_graph_replays.py 2>&1 | grep -v "^  \|^$" | tail -n 4
    done ;;
  rank-emulation)
    config=$RLINF_GPU_TEST_DIR/moonlight-config-only
    mkdir -p "$config" && cp tests/fixtures/moonlight-16b-a3b-config.json "$config/config.json"
    run timeout "${BENCH_TIMEOUT:-540}" python3 -m benchmarks.actor_throughput --model "$config" --backends megatron \
      --emulate-rank --rows 8 --micro-batch 1 --logprob-micro-batch 4 --prompt 1024 --response 8192 --steps 2 \
      --profile $tmp/actor-profile-rank "${@:2}" | tee -a "$RLINF_GPU_FIGURES" ;;
  smoke|actor|te-free-spec|grpo|bench|host|all) ;;
  *) echo "usage: $0 [smoke|actor|te-free-spec|grpo|bench|optim|resume|pack|grouped|experts|te-experts|graphs|graph-replays|host|bf16-ops|rank-emulation|all] [args]" >&2; exit 2 ;;
esac
cp -f "$RLINF_GPU_FIGURES" "$OUT/" 2>/dev/null
[ -e "$failed" ] && { rm -f "$failed"; status=1; }
exit $status
