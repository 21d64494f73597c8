# Sourced by the GPU check scripts. On a machine set up with `bash requirements/install.sh agentic`
# (plus pytest) it changes nothing. A GPU machine without a package registry can be provisioned from
# wheel folders in the checkout instead (tests/gpu/README.md): each one is installed only when present.

# Where the wheel folders' tools/install.sh put what they installed (and its env.sh).
KIT_SITE=${RLINF_KIT_SITE:-/tmp/site}

# Install the wheel folders among "$@" that exist (e.g. .wray .wmeg), then put every set installed
# on this machine so far on PYTHONPATH (and keep rlinf's cache and the compiled kernels under
# /tmp). RLINF_KITS_READY=1 (run_all.sh side-by-side, which installs them once before its suites
# start side by side): only the latter.
use_wheel_folders() {
  local folder
  for folder in "$@"; do
    if [ -f "$folder/tools/install.sh" ] && [ "${RLINF_KITS_READY:-0}" != 1 ]; then
      source "$folder/tools/install.sh" >/dev/null || return 1
    fi
  done
  if [ -f "$KIT_SITE/env.sh" ]; then
    source "$KIT_SITE/env.sh"
    # A machine provisioned this way keeps /tmp between commands but not always $HOME: what the
    # checks build once (GPU-tiny's warm start) is cached beside the installed kits, and so are the
    # kernels compiled at first use (triton's, flashinfer's MLA decode, torch extensions), which
    # otherwise default to $HOME and are compiled again by every command's first engine.
    export RLINF_CACHE_DIR=${RLINF_CACHE_DIR:-/tmp/rlinf-cache}
    export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/kernel-cache/triton}
    export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/kernel-cache}
    export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/kernel-cache/torch_extensions}
  fi
  return 0
}

# pytest from the environment, else from the .h10-pytest wheel folder when present.
use_pytest() {
  python3 -c "import pytest" 2>/dev/null && return 0
  if [ -d .h10-pytest ]; then
    python3 -m pip install -q --no-index --no-deps --target "$KIT_SITE/pytest" .h10-pytest/*.whl 2>/dev/null ||
      [ -d "$KIT_SITE/pytest" ] || return 1
    export PYTHONPATH=$KIT_SITE/pytest${PYTHONPATH:+:$PYTHONPATH}
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
