"""What a released SGLang engine still holds on the GPU (the memory a colocated actor cannot use).

Starts an engine on the 4-layer Moonlight slice (built in DIR when missing) as the GPU tests do
(triton attention, no CUDA graphs, 30% of the GPU), generates 256 x 16 tokens after 256-token
prompts (a 64k-token prefill fills the scheduler's allocator cache), releases every memory tag,
and reads the GPU's free memory before the engine, with it up, and after the release.
Prints JSON. Needs CUDA and sglang.

    python -m benchmarks.sglang_release_memory --model DIR
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

GIB = 2**30


def free_gib() -> float:
    return torch.cuda.mem_get_info()[0] / GIB


def measure(model: Path) -> dict:
    from rlinf.config.schema import Config
    from rlinf.workers.rollout.sampling import SamplingParams
    from rlinf.workers.rollout.sglang_args import engine_kwargs, request_seeds, sampling_dicts
    from rlinf.workers.rollout.sglang_engine import SGLangEngine

    cfg = Config()
    sglang = replace(cfg.rollout.sglang, attention_backend="triton", cuda_graph_max_bs=0)
    cfg = replace(cfg, rollout=replace(cfg.rollout, sglang=sglang, gpu_memory_utilization=0.3))
    free_before = free_gib()
    kwargs = engine_kwargs(cfg, model_path=str(model), colocated=True, needs_tokenizer=False)
    engine = SGLangEngine(kwargs, where="release probe")
    try:
        generator = torch.Generator().manual_seed(1)
        inputs = [torch.randint(0, 160000, (256,), generator=generator).tolist() for _ in range(256)]
        params = SamplingParams(temperature=1.0, max_new_tokens=16)
        engine.generate(inputs, sampling_dicts(params, [1], request_seeds(3, len(inputs))))
        free_up = free_gib()
        engine.release()
        torch.cuda.synchronize()
        free_released = free_gib()
    finally:
        engine.shutdown()
    return {
        "model": str(model),
        "gpu": torch.cuda.get_device_name(),
        "free_gib_before_engine": round(free_before, 2),
        "engine_up_gib": round(free_before - free_up, 2),
        "held_after_release_gib": round(free_before - free_released, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True, help="the slice's folder (built when missing)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sglang_release_memory.py needs a CUDA GPU")
    from benchmarks.rollout_decode import ensure_checkpoint

    ensure_checkpoint(args.model, layers=4)
    print(json.dumps(measure(args.model)))


if __name__ == "__main__":
    main()
