#!/usr/bin/env bash
# Install rlinf's Python stack.
#   bash requirements/install.sh embedded [--dev] [--wandb] [--venv DIR]   CPU / single-device stack (tiny
#                                                 model, tests, CI); --wandb adds the wandb logger
#   bash requirements/install.sh agentic [options]               GPU stack: SGLang rollout + Megatron actor
#   bash requirements/install.sh agentic -h                      the agentic options
#   bash requirements/install.sh megatron-cpu --venv DIR         Python 3.12 stack for tests/megatron_cpu (CI)
# docs/install.md explains them; requirements/agentic/README.md how the pinned sets are made.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${1:-}"
shift || true

usage() {
  echo "usage: bash requirements/install.sh embedded [--dev] [--wandb] [--venv DIR]"
  echo "       bash requirements/install.sh agentic [options]   (-h lists them)"
  echo "       bash requirements/install.sh megatron-cpu --venv DIR [--python PATH] [--dry-run]"
}

case "${TARGET}" in
  embedded)
    DEV=0
    WANDB=0
    VENV=""
    while [[ $# -gt 0 ]]; do
      case "$1" in
        --dev) DEV=1 ;;
        --wandb) WANDB=1 ;;
        --venv) VENV="${2:?--venv needs a directory}"; shift ;;
        *) echo "install.sh embedded: unknown option '$1'" >&2; usage >&2; exit 2 ;;
      esac
      shift
    done
    if [[ -n "${VENV}" ]]; then
      [[ -x "${VENV}/bin/python" ]] || python3 -m venv "${VENV}"
      # shellcheck disable=SC1091
      source "${VENV}/bin/activate"
    fi
    PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
    req="${REPO_ROOT}/requirements/embedded.txt"
    [[ "${DEV}" == "1" ]] && req="${REPO_ROOT}/requirements/dev.txt"
    extra=()
    [[ "${WANDB}" == "1" ]] && extra=(-r "${REPO_ROOT}/requirements/wandb.txt")
    "${PYTHON}" -m pip install --disable-pip-version-check -q -r "${req}" "${extra[@]}"
    "${PYTHON}" -m pip install --disable-pip-version-check -q --no-deps -e "${REPO_ROOT}"
    echo "rlinf embedded stack installed into $("${PYTHON}" -c 'import sys; print(sys.prefix)')"
    ;;
  agentic)
    exec bash "${REPO_ROOT}/requirements/agentic/install_agentic.sh" "$@"
    ;;
  megatron-cpu)
    exec bash "${REPO_ROOT}/requirements/install_megatron_cpu.sh" "$@"
    ;;
  -h | --help)
    usage
    ;;
  *)
    echo "install.sh: unknown target '${TARGET}' (embedded, agentic or megatron-cpu)" >&2
    usage >&2
    exit 2
    ;;
esac
