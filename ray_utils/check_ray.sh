#!/usr/bin/env bash
# Usage: bash ray_utils/check_ray.sh N   -- wait until the running Ray cluster reports N GPUs.
# Env: RAY_ADDRESS (default: auto), CHECK_RAY_TIMEOUT (600 s).
set -euo pipefail
WANT="${1:?usage: check_ray.sh NUM_GPUS}"
TIMEOUT="${CHECK_RAY_TIMEOUT:-600}"
# `ray start` enables token authentication and writes ~/.ray/auth_token, but a client given an
# explicit address defaults to no token: send it when it exists.
if [[ -z "${RAY_AUTH_MODE:-}" && -f "${HOME}/.ray/auth_token" ]]; then
  export RAY_AUTH_MODE=token
fi
waited=0
while true; do
  have="$(python - <<PY 2>/dev/null || echo -1
import ray
ray.init(address="${RAY_ADDRESS:-auto}", logging_level="ERROR", log_to_driver=False)
print(int(ray.cluster_resources().get("GPU", 0)))
PY
)"
  have="$(echo "${have}" | tail -n 1)"
  if [[ "${have}" -ge "${WANT}" ]] 2>/dev/null; then
    echo "Ray cluster ready: ${have} GPU(s) (wanted ${WANT})"
    exit 0
  fi
  if (( waited >= TIMEOUT )); then
    echo "check_ray.sh: cluster reports ${have} GPU(s) after ${TIMEOUT}s, wanted ${WANT} (-1 = no cluster reachable)" >&2
    exit 1
  fi
  sleep 5
  waited=$((waited + 5))
done
