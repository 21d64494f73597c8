#!/usr/bin/env bash
# Every GPU check, in parts that each fit a 10-minute command (one 80 GB GPU; setup:
# tests/gpu/README.md). On a machine with the agentic stack installed, run the parts in order, or
# `all` for all of them in one go:
#
#   bash tests/gpu/run_all.sh engine   SGLang engine: signatures, hooks, GPU-tiny logprobs / weight
#                                      pushes / memory, slice logprobs      (241 s on an H200)
#   bash tests/gpu/run_all.sh actor    Megatron actor checks, optim (precision-aware optimizer, save /
#                                      load, once), GRPO steps through the runner with the Megatron
#                                      actor and the torch rollout          (not yet timed; <= 580 s)
#   bash tests/gpu/run_all.sh pack     packed sequences (207 s on an H200), then rlinf's grouped-GEMM
#                                      experts                               (not yet timed; <= 300 s)
#   bash tests/gpu/run_all.sh sync     a Megatron actor and SGLang without Ray: the IPC weight sync in
#                                      the runner's memory order, the HF export of a trained slice
#                                      served                                (not yet timed; <= 560 s)
#   bash tests/gpu/run_all.sh loop     the GRPO loop colocated with SGLang: torch, Megatron, Megatron
#                                      offloaded between phases              (not yet timed; <= 560 s)
#   bash tests/gpu/run_all.sh step     the 3-step colocated step on the slice, then the routing-replay
#                                      step                                  (not yet timed; <= 580 s)
#   bash tests/gpu/run_all.sh summary  the JSON summary of every part run on this machine so far
#
# Machines provisioned from wheel folders instead (tests/gpu/README.md): `engine` needs .whl in the
# checkout, `te` installs .wte (Transformer Engine) alone, the others need .whl2 (or .wray + .wmeg),
# each part a call of its own, back to back on one warm machine: te, engine, actor, pack, sync, loop,
# step.
#
# Each part appends one record per suite to $SUMMARY (default /tmp/rlinf-gpu-run-all.jsonl: suite,
# passed, failed, skipped, errors, seconds and the figures the suite recorded) and writes the whole
# summary so far to $OUT/run_all_summary.json. Exit status: non-zero when any suite so far failed,
# skipped a test or ended early. Each record carries the fingerprint of the code the GPU runs
# (`python3 tests/gpu/run_all_summary.py code`: rlinf/, benchmarks/, examples/, tests/gpu/), so parts
# run on several machines add up to one run of one commit:
#
#   python3 tests/gpu/run_all_summary.py merge OUT.json PART_SUMMARY.json...
#
# is green only when every suite is there, green, and ran this checkout's code.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/gpu-run-all} PYTHONUNBUFFERED=1
SUMMARY=${SUMMARY:-/tmp/rlinf-gpu-run-all.jsonl}
mkdir -p "$OUT"
here=tests/gpu

# suite NAME FIGURES_FILE COMMAND...: run it, keep its log under $OUT, add its record to the summary
suite() {
  local name=$1 figures=$2 first start rc
  shift 2
  first=$(cat "$figures" 2>/dev/null | wc -l)
  start=$SECONDS
  echo "== run_all: $name: $*"
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  tail -n 15 "$OUT/$name.log"
  python3 $here/run_all_summary.py add "$SUMMARY" "$name" "$rc" $((SECONDS - start)) "$OUT/$name.log" "$figures" "$first"
}

megatron_figures=/tmp/megatron-checks/megatron_figures.jsonl
sglang_figures=/tmp/sglang-checks/sglang_figures.jsonl
megatron() { OUT=/tmp/megatron-checks bash $here/run_megatron_checks.sh "$@"; }
sglang() { OUT=/tmp/sglang-checks bash $here/sglang_gpu_checks.sh "$@"; }

part=${1:-all}
case "$part" in
  engine|all) suite engine "$sglang_figures" sglang engine ;;&
  te)
    source .wte/tools/install.sh >/dev/null && python3 .wte/tools/check_te.py
    exit $? ;;
  actor|all)
    # save / load runs once, in optim
    suite megatron-actor "$megatron_figures" megatron actor -k "not save_load and not fresh_actor"
    suite optim "$megatron_figures" megatron optim
    suite megatron-grpo "$megatron_figures" megatron grpo ;;&
  pack|all)
    suite pack "$megatron_figures" megatron pack
    suite grouped-experts "$megatron_figures" megatron experts ;;&
  sync|all) suite sync "$sglang_figures" sglang sync ;;&
  loop|all) suite loop "$sglang_figures" sglang loop ;;&
  step|all)  # figures: each step's rows (benchmarks/grpo_step_runner.py)
    rm -rf /tmp/sglang-checks/step-step /tmp/sglang-checks/step-replay
    suite step /tmp/sglang-checks/step-step/rows.jsonl env STEP_TAG=step STEP_TIMEOUT=300 \
      OUT=/tmp/sglang-checks bash $here/sglang_gpu_checks.sh step --steps 3
    suite routing-replay-step /tmp/sglang-checks/step-replay/rows.jsonl env STEP_TAG=replay STEP_TIMEOUT=280 \
      OUT=/tmp/sglang-checks bash $here/sglang_gpu_checks.sh step --routing-replay replay ;;&
  engine|actor|pack|sync|loop|step|all|summary) ;;
  *) echo "usage: $0 engine|te|actor|pack|sync|loop|step|all|summary" >&2; exit 2 ;;
esac
python3 $here/run_all_summary.py show "$SUMMARY" "$OUT/run_all_summary.json"
