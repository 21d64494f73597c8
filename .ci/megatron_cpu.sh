#!/usr/bin/env bash
# CI's Megatron CPU suite (.ci/run calls it; it also runs on its own): a Python 3.12 venv with
# megatron-core and Megatron-Bridge from `install.sh megatron-cpu`, kept outside the clone so that
# later runs on this machine reuse it while its pins match, then tests/megatron_cpu with every skip
# turned into a failure (RLINF_REQUIRE_MEGATRON=1). Prints how long each part took.
# RLINF_MEGATRON_CPU_VENV=DIR puts the venv elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RLINF_MEGATRON_CPU_VENV:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/rlinf/venv-megatron-cpu}"

start=${SECONDS}
bash requirements/install.sh megatron-cpu --venv "${venv}"
echo "ci: megatron-cpu venv ready in $((SECONDS - start)) s (${venv})"

start=${SECONDS}
rc=0
RLINF_REQUIRE_MEGATRON=1 "${venv}/bin/python" -m pytest tests/megatron_cpu || rc=$?
echo "ci: tests/megatron_cpu (Python 3.12, megatron-core) ran in $((SECONDS - start)) s"
if [[ ${rc} -eq 5 ]]; then
  echo "ci: pytest collected no test in tests/megatron_cpu" >&2
  exit 1
fi
exit "${rc}"
