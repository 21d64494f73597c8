#!/usr/bin/env bash
# Start this node's part of a Ray cluster.
#   RANK=0 (default): start the head and write its IP to ray_utils/ray_head_ip.txt
#   RANK>0:           wait for that file (shared filesystem), then join the head.
# Env: RAY_PORT (6379), RAY_HEAD_IP_FILE (ray_utils/ray_head_ip.txt), RAY_WAIT_TIMEOUT (600 s),
#      RAY_NODE_IP (this node's IP; default: first address of `hostname -I`),
#      RAY_START_ARGS (extra `ray start` arguments, e.g. "--num-gpus=8 --temp-dir=/scratch/ray").
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RANK="${RANK:-0}"
RAY_PORT="${RAY_PORT:-6379}"
HEAD_FILE="${RAY_HEAD_IP_FILE:-${SCRIPT_DIR}/ray_head_ip.txt}"
TIMEOUT="${RAY_WAIT_TIMEOUT:-600}"
NODE_IP="${RAY_NODE_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}"
NODE_IP="${NODE_IP:-127.0.0.1}"
read -r -a EXTRA_ARGS <<< "${RAY_START_ARGS:-}"

if [[ "${RANK}" == "0" ]]; then
  rm -f "${HEAD_FILE}"  # a stale file from an earlier run would send workers to a dead head
  ray start --head --port="${RAY_PORT}" --node-ip-address="${NODE_IP}" --disable-usage-stats "${EXTRA_ARGS[@]}"
  echo "${NODE_IP}" > "${HEAD_FILE}.tmp" && mv "${HEAD_FILE}.tmp" "${HEAD_FILE}"
  echo "Ray head started at ${NODE_IP}:${RAY_PORT}; address written to ${HEAD_FILE}"
else
  waited=0
  until [[ -s "${HEAD_FILE}" ]]; do
    if (( waited >= TIMEOUT )); then
      echo "start_ray.sh (RANK=${RANK}): no head address in ${HEAD_FILE} after ${TIMEOUT}s; start RANK=0 first" >&2
      exit 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
  HEAD_IP="$(cat "${HEAD_FILE}")"
  ray start --address="${HEAD_IP}:${RAY_PORT}" --node-ip-address="${NODE_IP}" --disable-usage-stats "${EXTRA_ARGS[@]}"
  echo "node ${NODE_IP} (RANK=${RANK}) joined the Ray head at ${HEAD_IP}:${RAY_PORT}"
fi
