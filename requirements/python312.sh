# shellcheck shell=bash
# Sourced by the install targets whose pins need CPython 3.12 (agentic, megatron-cpu).

python_minor() { # PYTHON : print its "major.minor", nothing when it does not run
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2> /dev/null || true
}

find_python312() { # [PYTHON] : print the first Python 3.12 of: PYTHON, python3.12 on PATH, pyenv's 3.12
  local c
  for c in "$@" "$(command -v python3.12 || true)" "${PYENV_ROOT:-${HOME:-}/.pyenv}"/versions/3.12*/bin/python; do
    [[ -n "${c}" && -x "${c}" && "$(python_minor "${c}")" == "3.12" ]] && { echo "${c}"; return 0; }
  done
  return 1
}
