#!/usr/bin/env bash
# Build .wfmla/ (about 3 MiB): sglang-kernel 0.4.2.post2's FlashMLA extension, which the device
# kit's .whl leaves out (../shared/device/prepare.sh trims it). Run here, from the project root,
# after prepare.sh has cached the wheel; carry [".whl", ".wfmla"] together (about 50 MiB) and
# `sglang_gpu_checks.sh depth27` puts the extension into the installed sgl_kernel, so the FlashMLA
# variants can run. Without .wfmla they are reported as unavailable.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${RLINF_DEVICE_CACHE:-$HOME/.cache/rlinf-device-wheels}
wheel=$(ls "$cache"/dl/sglang_kernel-0.4.2.post2-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "no sglang-kernel wheel under $cache/dl: run ../shared/device/prepare.sh sglang first" >&2; exit 1; }
rm -rf .wfmla && mkdir -p .wfmla
python3 - "$wheel" <<'PY'
import gzip, shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("sgl_kernel/flashmla_ops.abi3.so") as src:
    with gzip.open(".wfmla/flashmla_ops.abi3.so.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
PY
grep -qx '/.wfmla/' .git/info/exclude || echo '/.wfmla/' >>.git/info/exclude
du -sh .wfmla
