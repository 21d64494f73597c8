#!/usr/bin/env bash
# Every GPU check, in parts that each fit a 10-minute command (one 80 GB GPU; setup:
# tests/gpu/README.md). On a machine with the agentic stack installed, run the parts in order, or
# `all` for all of them in one go:
#
#   bash tests/gpu/run_all.sh engine   SGLang engine: signatures, hooks, GPU-tiny logprobs / weight
#                                      pushes / memory, slice logprobs      (194 s on an H100)
#   bash tests/gpu/run_all.sh actor    Megatron actor checks, optim (precision-aware optimizer, save /
#                                      load, once), GRPO steps through the runner with the Megatron
#                                      actor and the torch rollout   (124 + 156 + 99 s on an H100)
#   bash tests/gpu/run_all.sh pack     packed sequences against padded, then rlinf's grouped-GEMM
#                                      experts                        (48 + 110 s on an H100)
#   bash tests/gpu/run_all.sh graphs   the Megatron actor's CUDA graphs against eager (needs TE;
#                                      123 s on an H100)
#   bash tests/gpu/run_all.sh sync     a Megatron actor and SGLang without Ray: the IPC weight sync in
#                                      the runner's memory order             (82 s on an H100)
#   bash tests/gpu/run_all.sh export   a 3-step Megatron slice run exported by rlinf.export_hf and
#                                      served by SGLang                     (248 s on an H100)
#   bash tests/gpu/run_all.sh loop     the GRPO loop colocated with SGLang: torch, Megatron, Megatron
#                                      offloaded between phases  (<= 560 s; a fresh machine first
#                                      builds GPU-tiny's warm start, about 110 s of it)
#   bash tests/gpu/run_all.sh step     the 3-step colocated step on the slice (388 s on a fresh H100:
#                                      startup 216 s, then 9.6 s a step)
#   bash tests/gpu/run_all.sh replay   the routing-replay step (214 s on a warm H100)
#   bash tests/gpu/run_all.sh SUITE    one suite of a part (the names in SUITES below)
#   bash tests/gpu/run_all.sh summary  the JSON summary of every part run on this machine so far
#
#   Checks only: the benchmarks that run_megatron_checks.sh runs after its actor, pack and graphs
#   checks (logprob kernels, packed micro-batches, the graphed slice) stay out of run_all
#   (CHECKS_ONLY=1); docs/benchmarks.md gives their own commands.
#
#   bash tests/gpu/run_all.sh side-by-side [PART_OR_SUITE...]
#       On a machine with several GPUs: every suite (or those named) at once, each on a GPU of its
#       own (queued, longest first, while there are fewer GPUs than suites), each with its own
#       scratch folder (TMPDIR: checkpoints, Ray sessions, logs), torch.distributed port and
#       summary; their summaries merged into $OUT/run_all_summary.json (non-zero exit: a suite that
#       ran is not green; the suites not named are listed as missing). With few GPUs, name parts
#       that fit one command (e.g. 2 GPUs: `side-by-side engine actor`, then `pack sync`, ...).
#       SUITES_PER_GPU=N lets N suites share a GPU, for the suites that size nothing from the GPU's
#       free memory and time nothing ($SHARES_A_GPU): on one H200,
#       `SUITES_PER_GPU=4 bash tests/gpu/run_all.sh side-by-side actor grouped-experts` (on an 80 GB
#       card even two run out of memory).
#
# Machines provisioned from wheel folders instead (tests/gpu/README.md): `te` installs .wte
# (Transformer Engine), `install` the other folders present (.whl: SGLang; .whl2 or .wray + .wmeg:
# Ray, Megatron), each in a call of its own (`engine` installs .whl itself, the others .whl2), back
# to back on one warm machine: te, engine, actor, pack, graphs, sync, export, loop, step, replay;
# or te, install (.whl), install (.whl2), side-by-side.
#
# Each part appends one record per suite to $SUMMARY (default /tmp/rlinf-gpu-run-all.jsonl: suite,
# passed, failed, skipped, errors, seconds and the figures the suite recorded) and writes the whole
# summary so far to $OUT/run_all_summary.json; a suite that fails also brings back the logs it wrote
# (each end-to-end run's, pytest's) under $OUT/SUITE-logs. Exit status: non-zero when any suite so
# far failed, skipped a test or ended early. Each record carries the fingerprint of the code the GPU runs
# (`python3 tests/gpu/run_all_summary.py code`: rlinf/, benchmarks/, examples/, tests/gpu/), so parts
# run on several machines add up to one run of one commit:
#
#   python3 tests/gpu/run_all_summary.py merge OUT.json PART_SUMMARY.json...
#
# is green only when every suite is there, green, and ran this checkout's code.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=${TMPDIR:-/tmp}  # scratch: checkpoints, logs, Ray sessions (side-by-side gives each suite its own)
export OUT=${OUT:-$tmp/gpu-run-all} PYTHONUNBUFFERED=1
SUMMARY=${SUMMARY:-$tmp/rlinf-gpu-run-all.jsonl}
mkdir -p "$OUT"
here=tests/gpu

SUITES="engine megatron-actor optim megatron-grpo pack grouped-experts cuda-graphs sync hf-export loop step routing-replay-step"
declare -A PART_SUITES=([engine]="engine" [actor]="megatron-actor optim megatron-grpo"
  [pack]="pack grouped-experts" [graphs]="cuda-graphs" [sync]="sync" [export]="hf-export" [loop]="loop" [step]="step" [replay]="routing-replay-step"
  [all]="$SUITES")
# Longest first, for side-by-side's queue
BY_LENGTH="step routing-replay-step loop hf-export sync optim megatron-actor engine cuda-graphs pack grouped-experts megatron-grpo"
# The suites that may share a GPU (SUITES_PER_GPU > 1): SGLang sizes its KV cache from the memory
# free when it starts, and the CUDA graphs' check is about timing between host and GPU, so those
# run alone on theirs.
SHARES_A_GPU="megatron-actor optim megatron-grpo pack grouped-experts"

# suite NAME FIGURES_FILE COMMAND...: run it, keep its log under $OUT, add its record to the summary
suite() {
  local name=$1 figures=$2 first start rc
  shift 2
  first=$(cat "$figures" 2>/dev/null | wc -l)
  start=$SECONDS
  mkdir -p "$(dirname "$figures")" && touch "$tmp/.run_all-$name.start"
  echo "== run_all: $name: $*"
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  tail -n 15 "$OUT/$name.log"
  if [ "$rc" != 0 ]; then  # the failed suite's own logs (each run's, pytest's) come back with $OUT
    mkdir -p "$OUT/$name-logs"
    find "$(dirname "$figures")" -maxdepth 1 -name '*.log' -newer "$tmp/.run_all-$name.start" \
      -exec cp -t "$OUT/$name-logs" {} +
  fi
  python3 $here/run_all_summary.py add "$SUMMARY" "$name" "$rc" $((SECONDS - start)) "$OUT/$name.log" "$figures" "$first"
}

megatron_figures=$tmp/megatron-checks/megatron_figures.jsonl
sglang_figures=$tmp/sglang-checks/sglang_figures.jsonl
# checks only: the benchmarks that run_megatron_checks.sh runs after some of them are no checks
megatron() { CHECKS_ONLY=1 OUT=$tmp/megatron-checks bash $here/run_megatron_checks.sh "$@"; }
sglang() { OUT=$tmp/sglang-checks bash $here/sglang_gpu_checks.sh "$@"; }

run_suite() {
  case $1 in
    engine) suite engine "$sglang_figures" sglang engine ;;
    # save / load runs once, in optim
    megatron-actor) suite megatron-actor "$megatron_figures" megatron actor -k "not save_load and not fresh_actor" ;;
    optim) suite optim "$megatron_figures" megatron optim ;;
    megatron-grpo) suite megatron-grpo "$megatron_figures" megatron grpo ;;
    pack) suite pack "$megatron_figures" megatron pack ;;
    grouped-experts) suite grouped-experts "$megatron_figures" megatron experts ;;
    cuda-graphs) suite cuda-graphs "$megatron_figures" megatron graphs ;;
    sync) suite sync "$sglang_figures" sglang sync ;;
    hf-export) suite hf-export "$sglang_figures" sglang export ;;
    loop) suite loop "$sglang_figures" sglang loop ;;
    step)  # figures: each step's rows (benchmarks/grpo_step_runner.py)
      rm -rf "$tmp/sglang-checks/step-step"
      suite step "$tmp/sglang-checks/step-step/rows.jsonl" env STEP_TAG=step STEP_TIMEOUT=560 \
        OUT="$tmp/sglang-checks" bash $here/sglang_gpu_checks.sh step --steps 3 ;;
    routing-replay-step)
      rm -rf "$tmp/sglang-checks/step-replay"
      suite routing-replay-step "$tmp/sglang-checks/step-replay/rows.jsonl" env STEP_TAG=replay STEP_TIMEOUT=560 \
        OUT="$tmp/sglang-checks" bash $here/sglang_gpu_checks.sh step --routing-replay replay ;;
  esac
}

side_by_side() {
  local wanted=" " name gpus slots slot i=0 free per_gpu=${SUITES_PER_GPU:-1}
  for name in "$@"; do
    if [ -z "${PART_SUITES[$name]:-}" ] && [[ " $SUITES " != *" $name "* ]]; then
      echo "run_all side-by-side: $name is neither a part nor a suite ($SUITES)" >&2
      return 2
    fi
    wanted+="${PART_SUITES[$name]:-$name} "
  done
  [ "$wanted" = " " ] && wanted=" $SUITES "
  if ! [[ $per_gpu =~ ^[1-9][0-9]*$ ]]; then
    echo "run_all side-by-side: SUITES_PER_GPU=$per_gpu is not a whole number >= 1" >&2
    return 2
  fi
  if [ "$per_gpu" -gt 1 ]; then
    for name in $wanted; do
      if [[ " $SHARES_A_GPU " != *" $name "* ]]; then
        echo "run_all side-by-side: $name cannot share a GPU (SUITES_PER_GPU=$per_gpu); those that can: $SHARES_A_GPU" >&2
        return 2
      fi
    done
  fi
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  slots=$((gpus * per_gpu))
  if [ "$slots" -lt 2 ]; then
    echo "run_all side-by-side: needs two or more GPUs, this machine shows $gpus; run the parts one by one, or set SUITES_PER_GPU for $SHARES_A_GPU" >&2
    return 2
  fi
  source $here/provision.sh
  use_wheel_folders .whl .wray .wmeg .whl2 || return 1  # once, before the suites start
  export RLINF_KITS_READY=1
  local -a holder=()  # holder[slot]: the suite process in that slot; slot s is on GPU s % gpus
  for name in $BY_LENGTH; do
    [[ $wanted == *" $name "* ]] || continue
    while :; do
      free=""
      for ((slot = 0; slot < slots; slot++)); do
        if [ -z "${holder[$slot]:-}" ] || ! kill -0 "${holder[$slot]}" 2>/dev/null; then free=$slot; break; fi
      done
      [ -n "$free" ] && break
      wait -n
    done
    mkdir -p "$tmp/gpu-$name" "$OUT/$name"
    CUDA_VISIBLE_DEVICES=$((free % gpus)) TMPDIR=$tmp/gpu-$name MASTER_PORT=$((29600 + 20 * i)) OUT=$OUT/$name \
      SUMMARY=$tmp/gpu-$name/summary.jsonl bash $here/run_all.sh "$name" >"$OUT/$name.out" 2>&1 &
    holder[$free]=$!
    i=$((i + 1))
    echo "== run_all side-by-side: $name on GPU $((free % gpus)) (its output: $OUT/$name.out, $OUT/$name/)"
  done
  wait
  python3 $here/run_all_summary.py merge-some "$wanted" "$OUT/run_all_summary.json" "$OUT"/*/run_all_summary.json
}

part=${1:-all}
case "$part" in
  te)
    source .wte/tools/install.sh >/dev/null && python3 .wte/tools/check_te.py
    exit $? ;;
  install)
    source $here/provision.sh
    use_wheel_folders .whl .wray .wmeg .whl2
    exit $? ;;
  side-by-side)
    side_by_side "${@:2}"
    exit $? ;;
  summary) ;;
  *)
    suites=${PART_SUITES[$part]:-}
    [[ " $SUITES " == *" $part "* ]] && suites=$part
    if [ -z "$suites" ]; then
      echo "usage: $0 engine|actor|pack|graphs|sync|export|loop|step|replay|all|SUITE|te|install|side-by-side [PART...]|summary" >&2
      exit 2
    fi
    for name in $suites; do run_suite "$name"; done ;;
esac
python3 $here/run_all_summary.py show "$SUMMARY" "$OUT/run_all_summary.json"
