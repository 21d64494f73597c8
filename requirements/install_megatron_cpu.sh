#!/usr/bin/env bash
# `bash requirements/install.sh megatron-cpu ...` lands here: a Python 3.12 venv in which
# tests/megatron_cpu runs megatron-core and Megatron-Bridge on the CPU (what CI runs). The pins are
# requirements/megatron-cpu.txt (with dev.txt and embedded.txt) and megatron-cpu-no-deps.txt.
# Re-running is cheap: the venv records a hash of the pins it holds, and pip runs only when the
# pins changed since.
set -euo pipefail
REQ_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${REQ_DIR}/.." && pwd)"
ME="install.sh megatron-cpu"
# shellcheck source=requirements/python312.sh
source "${REQ_DIR}/python312.sh"
PIP_PIN="pip==26.3" # the pip that resolves the agentic locks (pip 23.x mis-handles extras names)
PIN_FILES=(megatron-cpu.txt dev.txt embedded.txt megatron-cpu-no-deps.txt)
STAMP_NAME=".rlinf-megatron-cpu-pins"

usage() {
  cat << EOF
usage: bash requirements/install.sh megatron-cpu --venv DIR [--python PATH] [--dry-run]

A Python 3.12 venv for the Megatron CPU tests (python -m pytest tests/megatron_cpu): torch 2.13.0,
megatron-core 0.19.2, megatron-bridge 0.6.2 (--no-deps), the embedded stack and the dev tools.
  --venv DIR      the venv to create, or to reuse when it is Python 3.12 (required)
  --python PATH   the Python 3.12 that creates it (default: python3.12 on PATH, then pyenv's 3.12)
  --dry-run       print the plan (venv, what runs, every pin) and install nothing
  -h, --help      this text
EOF
}

fail() { # MESSAGE... : one line on stderr, exit 2 (bad input)
  echo "${ME}: $*" >&2
  exit 2
}

VENV="" PYTHON_BIN="" DRY_RUN=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --venv | --python)
      [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || fail "$1 needs a value"
      [[ "$1" == "--venv" ]] && VENV="$2" || PYTHON_BIN="$2"
      shift
      ;;
    --dry-run) DRY_RUN=1 ;;
    -h | --help) usage; exit 0 ;;
    *) fail "unknown option '$1' (bash requirements/install.sh megatron-cpu -h lists the options)" ;;
  esac
  shift
done
[[ -n "${VENV}" ]] || fail "--venv DIR is required (the virtual environment to create or reuse)"
VENV="$(realpath -m "${VENV}")"
PY="${VENV}/bin/python"
STAMP_FILE="${VENV}/${STAMP_NAME}"

# --- checks before any work -----------------------------------------------------------------
if [[ -n "${PYTHON_BIN}" ]]; then
  version="$(python_minor "${PYTHON_BIN}")"
  [[ "${version}" == "3.12" ]] || fail "--python ${PYTHON_BIN} is Python ${version:-<not runnable>}; megatron-core 0.19's pins need 3.12"
fi
if [[ -e "${PY}" ]]; then
  version="$(python_minor "${PY}")"
  [[ "${version}" == "3.12" ]] || fail "${VENV} holds Python ${version:-<not runnable>}; the pins need 3.12: choose another --venv"
  VENV_ACTION="reuse (Python 3.12)"
elif [[ -e "${VENV}" && -n "$(ls -A "${VENV}")" ]]; then
  fail "${VENV} exists and is not a venv (no bin/python): choose another --venv"
else
  BASE_PYTHON="$(find_python312 ${PYTHON_BIN:+"${PYTHON_BIN}"})" ||
    fail "no Python 3.12 found (megatron-core 0.19 needs it): apt install python3.12-venv, pyenv install 3.12, or pass --python PATH"
  VENV_ACTION="create with ${BASE_PYTHON}"
fi

# --- what the venv should hold --------------------------------------------------------------
pins() { # FILE : its pins, following -r includes
  local line
  while IFS= read -r line; do
    line="${line%%#*}"
    line="${line%"${line##*[![:space:]]}"}" # trailing blanks
    [[ -z "${line}" ]] && continue
    if [[ "${line}" == "-r "* ]]; then pins "${REQ_DIR}/${line#-r }"; else echo "${line}"; fi
  done < "$1"
}
# The pins' identity: the pin files, pip and the Python they were installed for.
EXPECTED_STAMP="$({ echo "${PIP_PIN} python3.12"; for f in "${PIN_FILES[@]}"; do cat "${REQ_DIR}/${f}"; done; } | sha256sum | cut -d' ' -f1)"
if [[ -f "${STAMP_FILE}" && "$(cat "${STAMP_FILE}")" == "${EXPECTED_STAMP}" ]]; then
  PINS_ACTION="already installed (the venv's pin hash matches): pip does not run"
  PINS_MATCH=1
else
  PINS_ACTION="pip installs them (the venv has $([[ -f "${STAMP_FILE}" ]] && echo "another pin hash" || echo "no pin hash"))"
  PINS_MATCH=0
fi

echo "rlinf megatron-cpu install plan$([[ "${DRY_RUN}" == "1" ]] && echo " (--dry-run: nothing is installed)")"
echo "  venv:  ${VENV}: ${VENV_ACTION}"
echo "  pins:  ${PINS_ACTION}; pin hash ${EXPECTED_STAMP}"
echo "    ${PIP_PIN}"
pins "${REQ_DIR}/megatron-cpu.txt" | sed 's/^/    /'
echo "  --no-deps:"
pins "${REQ_DIR}/megatron-cpu-no-deps.txt" | sed 's/^/    /'
echo "  rlinf: editable install (--no-deps) of ${REPO_ROOT}, unless the venv already imports it from there"
echo "  check: import torch, megatron.core, megatron.bridge (through rlinf's TE placeholder)"
[[ "${DRY_RUN}" == "1" ]] && exit 0

# --- install --------------------------------------------------------------------------------
vpip() { "${PY}" -m pip "$1" --disable-pip-version-check "${@:2}"; }

if [[ ! -e "${PY}" ]]; then
  "${BASE_PYTHON}" -m venv "${VENV}"
  echo "${ME}: created ${VENV} from ${BASE_PYTHON}"
fi
if [[ "${PINS_MATCH}" == "0" ]]; then
  rm -f "${STAMP_FILE}" # written again only once every pin is in
  vpip install -q "${PIP_PIN}"
  vpip install -q -r "${REQ_DIR}/megatron-cpu.txt"
  vpip install -q --no-deps -r "${REQ_DIR}/megatron-cpu-no-deps.txt"
  echo "${EXPECTED_STAMP}" > "${STAMP_FILE}"
  echo "${ME}: pins installed"
else
  echo "${ME}: pins already installed"
fi
# -I: neither the working directory nor PYTHONPATH decides where rlinf comes from.
if [[ "$("${PY}" -I -c 'import os, rlinf; print(os.path.dirname(os.path.dirname(rlinf.__file__)))' 2> /dev/null)" == "${REPO_ROOT}" ]]; then
  echo "${ME}: rlinf already installed from ${REPO_ROOT}"
else
  vpip install -q --no-deps -e "${REPO_ROOT}"
  echo "${ME}: rlinf installed (editable) from ${REPO_ROOT}"
fi

check_log="$(mktemp)"
trap 'rm -f "${check_log}"' EXIT
if ! "${PY}" -I -W ignore - > "${check_log}" 2>&1 << 'EOF'; then
from rlinf.models.megatron import te_placeholder

placeholder = te_placeholder.install()
import megatron.bridge
import megatron.core
import torch

te = "rlinf's TE placeholder" if placeholder else "Transformer Engine"
print(f"torch {torch.__version__}, megatron-core {megatron.core.__version__}, megatron-bridge {megatron.bridge.__version__} ({te})")
EOF
  cat "${check_log}" >&2
  echo "${ME}: the import check failed (output above); re-run the same command after fixing its cause" >&2
  exit 1
fi
echo "${ME}: ${VENV} imports $(tail -n 1 "${check_log}")"
