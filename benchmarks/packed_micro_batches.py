"""Padding-free packing (`actor.pack_sequences`) against padded micro-batches, same token budget.

The torch (or, on a GPU, the Megatron) actor trains one optimizer step (`train`) on a GRPO-like batch whose responses vary in
length (uniform from 1 to --response tokens, prompts from --prompt/4 to --prompt), twice per mode:
micro-batches by `actor.max_tokens_per_micro_batch` padded (rows x longest row), then packed (each
micro-batch one row of its real tokens). The first call of each mode is a warm-up. Prints one
JSON object: real tokens/s of each mode, the tokens each forward ran (padding included), the
micro-batch counts, the speed-up, and the largest weight difference between the two modes' steps.

    python -m benchmarks.packed_micro_batches [--model DIR] [--rows 64] [--prompt 64]
        [--response 256] [--budget 2048] [--precision fp32|bf16] [--backend torch|megatron]
    (--model: an HF DeepSeek-V3 checkpoint; default a random tiny one built in a temp dir; the
    actor runs where its workers run: a GPU when there is one)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._common import ensure_tokenizer, release


def varied_batch(vocab: int, rows: int, prompt: int, response: int, seed: int = 0):
    from rlinf.data.batch import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(max(1, prompt // 4), prompt + 1, (rows,), generator=g)
    response_lens = torch.randint(1, response + 1, (rows,), generator=g)
    prompt_mask = torch.arange(prompt)[None] >= (prompt - prompt_lens)[:, None]
    response_mask = torch.arange(response)[None] < response_lens[:, None]
    return RolloutBatch(
        prompt_ids=torch.randint(3, vocab, (rows, prompt), generator=g).masked_fill(~prompt_mask, 0),
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, vocab, (rows, response), generator=g).masked_fill(~response_mask, 0),
        response_mask=response_mask,
        group_index=torch.arange(rows) // 8,
        rollout_logprobs=torch.zeros(rows, response),
        finish_reasons=["stop"] * rows,
        response_text=[""] * rows,
        solutions=[("0",)] * rows,
        advantages=torch.randn(rows, generator=g),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument(
        "--backend", default="torch", choices=("torch", "megatron"), help="megatron: a CUDA GPU"
    )
    args = parser.parse_args()

    from rlinf.config import load_config
    from rlinf.models.tiny import build_tiny_checkpoint
    from rlinf.workers.actor.base import with_logprobs
    from rlinf.workers.actor.micro_batches import micro_batch_cost
    from rlinf.workers.actor.policy_update import micro_batch_rows, row_lengths
    from rlinf.workers.actor.torch_actor import TorchActor

    if args.backend == "megatron":
        from rlinf.workers.actor.megatron_actor import MegatronActor as Actor

        backend = ["actor.training_backend=megatron", "actor.num_threads=null"]
    else:
        Actor, backend = TorchActor, []

    model = args.model or str(build_tiny_checkpoint(Path(tempfile.mkdtemp()) / "tiny", bootstrap=False))
    ensure_tokenizer(model)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    data = varied_batch(vocab, args.rows, args.prompt, args.response)
    real = int(data.prompt_mask.sum() + data.response_mask.sum())
    lengths = row_lengths(data)
    result: dict = {"benchmark": "packed_micro_batches", "backend": args.backend, "model": model, "rows": args.rows,
                    "real_tokens": real, "budget": args.budget}  # fmt: skip
    weights, actor = {}, None
    for mode, pack in (("padded", False), ("packed", True)):
        if actor is not None:  # two Megatron actors of the slice with their optimizers outgrow an 80 GB GPU
            release(actor)
        overrides = [
            f"actor.model.model_path={model}",
            f"actor.model.precision={args.precision}",
            f"actor.pack_sequences={str(pack).lower()}",
            f"actor.max_tokens_per_micro_batch={args.budget}",
            f"actor.global_batch_size={args.rows}",
            f"actor.seq_length={args.prompt + args.response}",
            f"data.max_prompt_length={args.prompt}",
            f"algorithm.sampling_params.max_new_tokens={args.response}",
            "actor.optim.lr=1e-5",
            *backend,
        ]
        actor = Actor(load_config("tiny-moe-grpo-cpu", overrides))
        result["device"] = str(actor.device)
        plan = micro_batch_rows(actor, data, actor.settings)
        ran = sum(micro_batch_cost([lengths[i] for i in rows], pack) for rows in plan)
        batch = with_logprobs(data, [actor.compute_logprobs(data)])
        actor.train(batch, step=1)  # warm-up, and the step the two modes must agree on
        weights[mode] = {name: w.cpu() for name, w in actor.named_weights().items()}
        began = time.perf_counter()
        actor.train(batch, step=2)
        seconds = time.perf_counter() - began
        result[mode] = {"seconds_per_train_call": round(seconds, 3), "real_tokens_per_s": round(real / seconds, 1),
                        "tokens_run": ran, "micro_batches": len(plan)}  # fmt: skip
        print(json.dumps({mode: result[mode]}), file=sys.stderr, flush=True)
    result["speedup"] = round(
        result["padded"]["seconds_per_train_call"] / result["packed"]["seconds_per_train_call"], 2
    )
    result["max_weight_diff_after_one_step"] = max(
        float((weights["packed"][k] - weights["padded"][k]).abs().max()) for k in weights["padded"]
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
