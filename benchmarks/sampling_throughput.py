"""Throughput of the torch rollout sampler against HF `generate(do_sample=True)` on the same batch.

Both decode exactly --new-tokens tokens per row (EOS is masked by min_new_tokens) from the same
left-padded prompts, so they do the same work. Prints one JSON object.

    python -m benchmarks.sampling_throughput [--threads 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import DeepseekV3ForCausalLM

from rlinf.models.tiny import TinyModelSettings, random_deepseek_v3
from rlinf.workers.rollout.sampling import SamplingParams, sample

PAD, EOS = 0, 1


def tiny_model(device: str) -> DeepseekV3ForCausalLM:
    """The tiny model's sizes, with one shared expert; seeded random weights."""
    settings = TinyModelSettings(n_shared_experts=1, max_position_embeddings=256)
    return random_deepseek_v3(settings, vocab_size=64, seed=0, pad_token_id=PAD, eos_token_id=EOS).to(device)


def random_prompts(num: int, generator: torch.Generator) -> list[list[int]]:
    lengths = torch.randint(8, 25, (num,), generator=generator).tolist()
    return [torch.randint(2, 64, (n,), generator=generator).tolist() for n in lengths]


def time_ours(model, prompts, new_tokens: int, device: str) -> float:
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    generator = torch.Generator(device=device).manual_seed(0)
    start = time.perf_counter()
    out = sample(model, prompts, params, eos_token_ids=[EOS], pad_token_id=PAD, generator=generator)
    assert int(out.response_mask.sum()) == len(prompts) * new_tokens
    return time.perf_counter() - start


def time_hf_generate(model, prompts, new_tokens: int, device: str) -> float:
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=PAD,
            eos_token_id=EOS,
        )
    assert out.shape[1] == width + new_tokens
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=2, help="best of N timed runs, after one warm-up")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = tiny_model(args.device)
    prompts = random_prompts(args.prompts, torch.Generator().manual_seed(1))
    tokens = args.prompts * args.new_tokens

    ours = [time_ours(model, prompts, args.new_tokens, args.device) for _ in range(args.repeats + 1)][1:]
    hf = [time_hf_generate(model, prompts, args.new_tokens, args.device) for _ in range(args.repeats + 1)][1:]
    print(
        json.dumps(
            {
                "tokens_per_s": round(tokens / min(ours), 1),
                "seconds": round(min(ours), 3),
                "reference_hf_generate_tokens_per_s": round(tokens / min(hf), 1),
                "reference_hf_generate_seconds": round(min(hf), 3),
                "prompts": args.prompts,
                "new_tokens": args.new_tokens,
                "threads": args.threads,
                "device": args.device,
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
