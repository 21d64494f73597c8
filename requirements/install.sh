#!/usr/bin/env bash
# Install rlinf's Python stack.
#   bash requirements/install.sh embedded [--dev] [--venv DIR]   CPU / single-device stack (tiny model, tests)
#   bash requirements/install.sh agentic ...                       GPU stack (Megatron + SGLang): see below
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${1:-}"
shift || true
DEV=0
VENV=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dev) DEV=1 ;;
    --venv) VENV="$2"; shift ;;
    *) break ;;
  esac
  shift
done

if [[ -n "${VENV}" ]]; then
  [[ -x "${VENV}/bin/python" ]] || python3 -m venv "${VENV}"
  # shellcheck disable=SC1091
  source "${VENV}/bin/activate"
fi
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"

case "${TARGET}" in
  embedded)
    req="${REPO_ROOT}/requirements/embedded.txt"
    [[ "${DEV}" == "1" ]] && req="${REPO_ROOT}/requirements/dev.txt"
    "${PYTHON}" -m pip install --disable-pip-version-check -q -r "${req}"
    "${PYTHON}" -m pip install --disable-pip-version-check -q --no-deps -e "${REPO_ROOT}"
    echo "rlinf embedded stack installed into $("${PYTHON}" -c 'import sys; print(sys.prefix)')"
    ;;
  agentic)
    echo "install.sh agentic: the GPU stack (Megatron-Bridge actor, SGLang rollout) is not part of this" >&2
    echo "release yet; the embedded stack runs on CPU or one GPU: bash requirements/install.sh embedded" >&2
    exit 1
    ;;
  *)
    echo "usage: bash requirements/install.sh embedded [--dev] [--venv DIR]" >&2
    exit 2
    ;;
esac
