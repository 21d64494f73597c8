#!/usr/bin/env bash
# `bash requirements/install.sh agentic ...` lands here: the GPU stack (SGLang rollout, Megatron
# actor through Megatron-Bridge, Ray, the embedded stack) in a Python 3.12 virtual environment.
# Every version comes from one pinned combination under requirements/agentic/<combination>/.
# Re-running the same command is safe: finished steps are pip no-ops ("already satisfied").
set -euo pipefail
AGENTIC_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${AGENTIC_DIR}/../.." && pwd)"
ME="install.sh agentic"
# shellcheck source=requirements/python312.sh
source "${REPO_ROOT}/requirements/python312.sh"

usage() {
  cat <<EOF
usage: bash requirements/install.sh agentic [options]

Installs the GPU stack into a Python 3.12 virtual environment, from one pinned combination.
  --venv PATH        virtual environment to create or reuse (required unless --dry-run)
  --sglang V         SGLang version      } together they name one combination under
  --torch V          torch version       } requirements/agentic/; a version left out is taken
  --transformers V   transformers version} from the only combination that fits the others
  --platform nvidia  accelerator platform; only nvidia (CUDA, Linux x86_64) is supported
  --python PATH      Python 3.12 used to create the venv (default: python3.12 on PATH, then pyenv)
  --use-mirror       install from the index in RLINF_PIP_MIRROR, else pip's configured index-url
  --no-te            skip Transformer Engine (a source build; the Megatron actor then runs its TE-free path)
  --no-flash-attn    skip flash-attn (a source build; no rlinf code path needs it)
  --no-apex          skip NVIDIA apex (a source build; only for gradient_accumulation_fusion)
  --dry-run          print the plan (every step, package and version) and install nothing
  -h, --help         this text
Environment: MEGATRON_PATH=/path/to/Megatron-LM reuses that clone (editable install) instead of
the pinned megatron-core wheel. MAX_JOBS caps the parallel compile jobs of the source builds.
Supported combinations:
$(list_combinations)
EOF
}

list_combinations() {
  local d
  for d in "${AGENTIC_DIR}"/*/; do
    [[ -f "${d}lock.txt" ]] || continue
    d="$(basename "${d}")"
    echo "  $(combination_words "${d}")   (requirements/agentic/${d})"
  done
}

# "sglang-0.5.12_torch-2.11.0_transformers-5.6.0" -> "--sglang 0.5.12 --torch 2.11.0 --transformers 5.6.0"
combination_words() {
  local out="" part
  IFS=_ read -r -a parts <<< "$1"
  for part in "${parts[@]}"; do out+="--${part%%-*} ${part#*-} "; done
  echo "${out% }"
}

fail() { # MESSAGE... : one clear line on stderr, exit 2 (bad input)
  echo "${ME}: $*" >&2
  exit 2
}

VENV="" SGLANG="" TORCH="" TRANSFORMERS="" PLATFORM="nvidia" PYTHON_BIN=""
USE_MIRROR=0 WITH_TE=1 WITH_FLASH_ATTN=1 WITH_APEX=1 DRY_RUN=0
while [[ $# -gt 0 ]]; do
  opt="$1"
  case "${opt}" in
    --venv | --sglang | --torch | --transformers | --platform | --python)
      [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || fail "${opt} needs a value"
      case "${opt}" in
        --venv) VENV="$2" ;;
        --sglang) SGLANG="$2" ;;
        --torch) TORCH="$2" ;;
        --transformers) TRANSFORMERS="$2" ;;
        --platform) PLATFORM="$2" ;;
        --python) PYTHON_BIN="$2" ;;
      esac
      shift
      ;;
    --use-mirror) USE_MIRROR=1 ;;
    --no-te) WITH_TE=0 ;;
    --no-flash-attn) WITH_FLASH_ATTN=0 ;;
    --no-apex) WITH_APEX=0 ;;
    --dry-run) DRY_RUN=1 ;;
    -h | --help) usage; exit 0 ;;
    *) fail "unknown option '${opt}' (bash requirements/install.sh agentic -h lists the options)" ;;
  esac
  shift
done

[[ "${PLATFORM}" == "nvidia" ]] || fail "--platform ${PLATFORM} is not supported: only --platform nvidia (CUDA on Linux x86_64) has pinned wheels"
[[ -n "${VENV}" || "${DRY_RUN}" == "1" ]] || fail "--venv PATH is required (the virtual environment to create or reuse)"

# --- pick the combination -------------------------------------------------------------------
matches=()
for d in "${AGENTIC_DIR}"/*/; do
  [[ -f "${d}lock.txt" ]] || continue
  name="$(basename "${d}")"
  [[ -z "${SGLANG}" || "${name}" == *"sglang-${SGLANG}_"* ]] || continue
  [[ -z "${TORCH}" || "${name}" == *"_torch-${TORCH}_"* ]] || continue
  [[ -z "${TRANSFORMERS}" || "${name}" == *"_transformers-${TRANSFORMERS}" ]] || continue
  matches+=("${name}")
done
asked="--sglang ${SGLANG:-any} --torch ${TORCH:-any} --transformers ${TRANSFORMERS:-any}"
if [[ ${#matches[@]} -eq 0 ]]; then
  { echo "${ME}: no pinned combination for ${asked}. Supported combinations:"; list_combinations; } >&2
  exit 2
elif [[ ${#matches[@]} -gt 1 ]]; then
  { echo "${ME}: ${asked} fits several combinations; name all three versions. Supported:"; list_combinations; } >&2
  exit 2
fi
COMBO="${matches[0]}"
COMBO_DIR="${AGENTIC_DIR}/${COMBO}"

# --- package index --------------------------------------------------------------------------
INDEX_URL="" INDEX_NOTE="pip's configuration (default https://pypi.org/simple)"
if [[ "${USE_MIRROR}" == "1" ]]; then
  if [[ -n "${RLINF_PIP_MIRROR:-}" ]]; then
    INDEX_URL="${RLINF_PIP_MIRROR}" INDEX_NOTE="RLINF_PIP_MIRROR"
  elif [[ -n "${PIP_INDEX_URL:-}" ]]; then
    INDEX_URL="${PIP_INDEX_URL}" INDEX_NOTE="PIP_INDEX_URL (pip's configured index)"
  elif cfg="$(python3 -m pip config get global.index-url 2>/dev/null)" && [[ -n "${cfg}" ]]; then
    INDEX_URL="${cfg}" INDEX_NOTE="pip config global.index-url"
  else
    INDEX_NOTE="--use-mirror: neither RLINF_PIP_MIRROR nor a pip index-url is set, so pip's default index https://pypi.org/simple"
  fi
fi

# --- the plan -------------------------------------------------------------------------------
pins() { grep -v -E '^\s*(#|$)' "$1" | sed -E 's/\s+#.*$//'; }
source_line() { awk -v s="$1" '$1 == s { $1 = ""; sub(/^ +/, ""); print }' "${COMBO_DIR}/source-builds.txt"; }
MEGATRON_PATH="${MEGATRON_PATH:-}"
if [[ -n "${MEGATRON_PATH}" ]]; then
  [[ -f "${MEGATRON_PATH}/megatron/core/package_info.py" ]] ||
    fail "MEGATRON_PATH=${MEGATRON_PATH} is not a Megatron-LM clone (no megatron/core/package_info.py)"
  MEGATRON_CLONE_VERSION="$(sed -n -E "s/^(MAJOR|MINOR|PATCH) *= *([0-9]+).*/\2/p" \
    "${MEGATRON_PATH}/megatron/core/package_info.py" | paste -sd. -)"
fi
LOCK_PINS="$(pins "${COMBO_DIR}/lock.txt")"
[[ -n "${MEGATRON_PATH}" ]] && LOCK_PINS="$(grep -v -i '^megatron-core==' <<< "${LOCK_PINS}")"
MCORE_PIN="$(pins "${COMBO_DIR}/lock.txt" | grep -i '^megatron-core==' || true)"

STEPS=(platform venv pip lock megatron-core no-deps rlinf transformer-engine flash-attn apex import-check)
print_plan() {
  local n=0 s
  echo "rlinf agentic install plan$([[ "${DRY_RUN}" == "1" ]] && echo " (--dry-run: nothing is installed)")"
  echo "  combination: $(combination_words "${COMBO}")  (requirements/agentic/${COMBO})"
  echo "  platform:    nvidia: CUDA builds, Linux x86_64, CPython 3.12"
  echo "  venv:        ${VENV:-<not given>}"
  echo "  index:       ${INDEX_URL:-default} (${INDEX_NOTE})"
  for s in "${STEPS[@]}"; do
    n=$((n + 1))
    case "${s}" in
      platform) echo "step ${n}/${#STEPS[@]} platform: check Linux x86_64 and warn when no NVIDIA driver is visible" ;;
      venv) echo "step ${n}/${#STEPS[@]} venv: create ${VENV:-<--venv>} with Python 3.12 if missing, else check it is 3.12" ;;
      pip) echo "step ${n}/${#STEPS[@]} pip: the pip the pins were resolved with"; pins "${COMBO_DIR}/pip.txt" | sed 's/^/    /' ;;
      lock) echo "step ${n}/${#STEPS[@]} lock: $(wc -l <<< "${LOCK_PINS}") pinned packages, installed with pip's dependency check"
        sed 's/^/    /' <<< "${LOCK_PINS}" ;;
      megatron-core)
        if [[ -n "${MEGATRON_PATH}" ]]; then
          echo "step ${n}/${#STEPS[@]} megatron-core: editable install (pip install --no-deps -e) of MEGATRON_PATH=${MEGATRON_PATH}, the clone's version (the combination pins ${MCORE_PIN#*==})"
          echo "    megatron-core==${MEGATRON_CLONE_VERSION}"
        else
          echo "step ${n}/${#STEPS[@]} megatron-core: the pinned wheel, already in the lock (${MCORE_PIN}); set MEGATRON_PATH to reuse a clone"
        fi ;;
      no-deps) echo "step ${n}/${#STEPS[@]} no-deps: installed with --no-deps (why: requirements/agentic/${COMBO}/no-deps.txt)"
        pins "${COMBO_DIR}/no-deps.txt" | sed 's/^/    /' ;;
      rlinf) echo "step ${n}/${#STEPS[@]} rlinf: editable install (--no-deps) of ${REPO_ROOT}" ;;
      transformer-engine | flash-attn | apex)
        local flag="--no-te" want="${WITH_TE}"
        [[ "${s}" == "flash-attn" ]] && flag="--no-flash-attn" want="${WITH_FLASH_ATTN}"
        [[ "${s}" == "apex" ]] && flag="--no-apex" want="${WITH_APEX}"
        if [[ "${want}" == "1" ]]; then
          echo "step ${n}/${#STEPS[@]} ${s}: SOURCE BUILD against torch and the CUDA toolkit (needs nvcc; see docs/install.md for time)"
          echo "    $(source_line "${s}")"
        else
          echo "step ${n}/${#STEPS[@]} ${s}: skipped (${flag})"
        fi ;;
      import-check) echo "step ${n}/${#STEPS[@]} import-check: import torch (CUDA), sglang, megatron.core, megatron.bridge, ray in the venv" ;;
    esac
  done
}
print_plan
[[ "${DRY_RUN}" == "1" ]] && exit 0

# --- run the steps --------------------------------------------------------------------------
STEP_NO=0
run_step() { # NAME FUNCTION : run one step, stop the install at the first failure naming it
  STEP_NO=$((STEP_NO + 1))
  echo
  echo "== ${ME}: step ${STEP_NO}/${#STEPS[@]} $1"
  local rc=0
  "$2" || rc=$?
  if [[ ${rc} -ne 0 ]]; then
    echo "${ME}: step '$1' failed (exit ${rc}); later steps did not run." >&2
    echo "${ME}: fix the cause above and re-run the same command: finished steps are no-ops." >&2
    exit 1
  fi
}

PIP_ARGS=(--disable-pip-version-check)
[[ -n "${INDEX_URL}" ]] && PIP_ARGS+=(--index-url "${INDEX_URL}")
PY="${VENV}/bin/python"
vpip() { "${PY}" -m pip "$1" "${PIP_ARGS[@]}" "${@:2}"; }

step_platform() {
  [[ "$(uname -s)" == "Linux" && "$(uname -m)" == "x86_64" ]] || {
    echo "the pinned wheels are for Linux x86_64; this machine is $(uname -s) $(uname -m)" >&2
    return 1
  }
  command -v nvidia-smi > /dev/null || echo "warning: no nvidia-smi here; installing anyway (torch 2.11.0's wheels need an NVIDIA driver for CUDA 13.0 at run time)"
}

step_venv() {
  if [[ -x "${PY}" ]]; then
    local v
    v="$("${PY}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    [[ "${v}" == "3.12" ]] || { echo "${VENV} exists with Python ${v}; the pins need 3.12: choose another --venv" >&2; return 1; }
    echo "reusing ${VENV} (Python ${v})"
    return 0
  fi
  local base
  base="$(find_python312 "${PYTHON_BIN}")" || {
    echo "no Python 3.12 found (sglang 0.5.12's and megatron-core 0.19's wheels need it): install it" \
      "(apt install python3.12-venv, or pyenv install 3.12) or pass --python /path/to/python3.12" >&2
    return 1
  }
  "${base}" -m venv "${VENV}"
  echo "created ${VENV} from ${base}"
}

step_pip() { vpip install -q -r "${COMBO_DIR}/pip.txt"; }

step_lock() {
  local req="${COMBO_DIR}/lock.txt"
  if [[ -n "${MEGATRON_PATH}" ]]; then
    req="$(mktemp)"
    printf '%s\n' "${LOCK_PINS}" > "${req}"
  fi
  vpip install -r "${req}"
}

step_megatron_core() {
  [[ -n "${MEGATRON_PATH}" ]] || { echo "pinned wheel ${MCORE_PIN} came with the lock"; return 0; }
  [[ "${MEGATRON_CLONE_VERSION}" == "${MCORE_PIN#*==}" ]] ||
    echo "warning: MEGATRON_PATH holds megatron-core ${MEGATRON_CLONE_VERSION}; this combination was verified with ${MCORE_PIN#*==}"
  # Editable install, not PYTHONPATH: the venv then records megatron-core (pip removes an earlier
  # wheel copy, so exactly one megatron is importable), it works in every shell that activates the
  # venv, and edits in the clone take effect without reinstalling.
  vpip install --no-deps -e "${MEGATRON_PATH}"
}

step_no_deps() { vpip install --no-deps -r "${COMBO_DIR}/no-deps.txt"; }
step_rlinf() { vpip install -q --no-deps -e "${REPO_ROOT}"; }

need_nvcc() { # STEP FLAG
  local nvcc="${CUDA_HOME:+${CUDA_HOME}/bin/}nvcc"
  command -v "${nvcc}" > /dev/null && return 0
  echo "$1 is built from source and needs the CUDA toolkit (nvcc, CUDA 13.x like torch 2.11.0+cu130):" \
    "put nvcc on PATH or set CUDA_HOME, or pass $2" >&2
  return 1
}

step_transformer_engine() {
  [[ "${WITH_TE}" == "1" ]] || { echo "skipped (--no-te)"; return 0; }
  need_nvcc transformer-engine --no-te || return 1
  # transformer_engine_torch has no wheel for torch 2.11: pip compiles it against the venv's torch.
  NVTE_FRAMEWORK=pytorch MAX_JOBS="${MAX_JOBS:-8}" vpip install --no-build-isolation "$(source_line transformer-engine)"
}

step_flash_attn() {
  [[ "${WITH_FLASH_ATTN}" == "1" ]] || { echo "skipped (--no-flash-attn)"; return 0; }
  need_nvcc flash-attn --no-flash-attn || return 1
  MAX_JOBS="${MAX_JOBS:-8}" vpip install --no-build-isolation "$(source_line flash-attn)"
}

step_apex() {
  [[ "${WITH_APEX}" == "1" ]] || { echo "skipped (--no-apex)"; return 0; }
  need_nvcc apex --no-apex || return 1
  APEX_CPP_EXT=1 APEX_CUDA_EXT=1 APEX_PARALLEL_BUILD="${MAX_JOBS:-8}" vpip install --no-build-isolation "$(source_line apex)"
}

step_import_check() { "${PY}" "${AGENTIC_DIR}/check_stack.py"; }

run_step platform step_platform
run_step venv step_venv
run_step pip step_pip
run_step lock step_lock
run_step megatron-core step_megatron_core
run_step no-deps step_no_deps
run_step rlinf step_rlinf
run_step transformer-engine step_transformer_engine
run_step flash-attn step_flash_attn
run_step apex step_apex
run_step import-check step_import_check

echo
echo "rlinf agentic stack installed in ${VENV} ($(combination_words "${COMBO}"))."
echo "Activate it:   source ${VENV}/bin/activate"
echo "Check it:      python ${AGENTIC_DIR}/check_stack.py"
