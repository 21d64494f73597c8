#!/usr/bin/env bash
# Usage: bash examples/reasoning/run_main_grpo_math.sh [recipe] [key=value overrides...]
# With no recipe it runs the tiny CPU default (tiny-moe-grpo-cpu). Recipes live in
# examples/reasoning/config/math/. On a GPU node start Ray first: bash ray_utils/start_ray.sh
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RECIPE="${1:-tiny-moe-grpo-cpu}"
shift || true
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
export TOKENIZERS_PARALLELISM=false
exec python "${REPO_ROOT}/examples/reasoning/main_grpo.py" "${RECIPE}" "$@"
