# Sourced by the GPU check scripts. On a machine set up with `bash requirements/install.sh agentic`
# (plus pytest) it changes nothing. A GPU machine without a package registry can be provisioned from
# wheel folders in the checkout instead (tests/gpu/README.md): each one is installed only when present.

# Install the wheel folders among "$@" that exist (e.g. .wray .wmeg), then put every set installed
# on this machine so far on PYTHONPATH (and keep rlinf's cache under /tmp). RLINF_KITS_READY=1
# (run_all.sh side-by-side, which installs them once before its suites start side by side): only
# the latter.
use_wheel_folders() {
  local folder
  for folder in "$@"; do
    if [ -f "$folder/tools/install.sh" ] && [ "${RLINF_KITS_READY:-0}" != 1 ]; then
      source "$folder/tools/install.sh" >/dev/null || return 1
    fi
  done
  if [ -f /tmp/site/env.sh ]; then
    source /tmp/site/env.sh
    # A machine provisioned this way keeps /tmp between commands but not always $HOME: what the
    # checks build once (GPU-tiny's warm start) is cached beside the installed kits.
    export RLINF_CACHE_DIR=${RLINF_CACHE_DIR:-/tmp/rlinf-cache}
  fi
  return 0
}

# pytest from the environment, else from the .h10-pytest wheel folder when present.
use_pytest() {
  python3 -c "import pytest" 2>/dev/null && return 0
  if [ -d .h10-pytest ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site/pytest .h10-pytest/*.whl 2>/dev/null ||
      [ -d /tmp/site/pytest ] || return 1
    export PYTHONPATH=/tmp/site/pytest${PYTHONPATH:+:$PYTHONPATH}
    return 0
  fi
  echo "pytest is not installed: python3 -m pip install pytest" >&2
  return 1
}

# A warm-started GPU-tiny checkpoint in the checkout (built on any machine, see tests/gpu/README.md)
# saves the tests its warm start; without one they build it themselves.
use_tiny_checkpoint() {
  local folder
  for folder in "$@"; do
    if [ -d "$folder" ]; then
      export RLINF_GPU_TINY=$PWD/$folder
      return 0
    fi
  done
}
