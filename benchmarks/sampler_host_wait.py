"""Does a sampler make the host wait for the GPU? torch.multinomial against rlinf's SGLang-plugin
sampler (rlinf/workers/rollout/sglang_hooks.py) at a decode batch of 256 x Moonlight's vocabulary.

For each: queue ~1 s of GPU work (torch.cuda._sleep), call the sampler, and report the host time
of the call and whether the GPU was still busy when it returned (a host read would have waited);
then the GPU time per call over 50 calls. Prints JSON. Needs CUDA.

    python -m benchmarks.sampler_host_wait
"""

from __future__ import annotations

import json
import time

import torch

from rlinf.workers.rollout.sglang_hooks import sample_from_probs


def measure(name: str, call) -> dict:
    call()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)
    start = time.perf_counter()
    call()
    host = time.perf_counter() - start
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(50):
        call()
    end.record()
    torch.cuda.synchronize()
    return {
        "sampler": name,
        "host_ms_with_gpu_busy": round(host * 1e3, 3),
        "gpu_still_busy_on_return": still_busy,
        "gpu_ms_per_call": round(begin.elapsed_time(end) / 50, 4),
    }


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("sampler_host_wait.py needs a CUDA GPU")
    probs = torch.softmax(torch.randn(256, 163840, device="cuda") * 3, dim=-1)
    rows = [
        measure("torch.multinomial", lambda: torch.multinomial(probs, 1)),
        measure("rlinf sample_from_probs", lambda: sample_from_probs(probs)),
    ]
    print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "rows": rows}))


if __name__ == "__main__":
    main()
