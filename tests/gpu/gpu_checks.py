"""Pieces the GPU checks share: figure records, the HF logprob recompute, greedy rows from an
SGLang engine and from an HF model (what "the engine serves these weights" is checked with)."""

from __future__ import annotations

import json
import os

import torch

from rlinf.models.logprobs import response_logprobs
from rlinf.workers.rollout.sampling import SamplingParams, sample
from rlinf.workers.rollout.sglang_args import parse_outputs, request_seeds, sampling_dicts


def record(name: str, **figures) -> None:
    """One JSON line on stdout and, when RLINF_GPU_FIGURES names a file, appended to it; it names
    the GPU the check ran on."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    line = json.dumps({"check": name, "gpu": gpu, **figures})
    print(line)
    path = os.environ.get("RLINF_GPU_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def recompute_logprobs(model, batch, temperature: float = 1.0) -> torch.Tensor:
    """fp32 [B, R] logprobs of `batch`'s responses (anything with the RolloutBatch id / mask
    fields, on any device) under `model`, on the GPU."""
    with torch.no_grad():
        lp, _ = response_logprobs(
            model,
            batch.prompt_ids.cuda(),
            batch.prompt_mask.cuda(),
            batch.response_ids.cuda(),
            batch.response_mask.cuda(),
            temperature=temperature,
        )
    return lp.float()


def real_tokens(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    return [row[m].tolist() for row, m in zip(ids.cpu(), mask.cpu(), strict=True)]


def engine_greedy(engine, prompts, eos: list[int], pad: int, max_new: int = 12) -> list[list[int]]:
    params = SamplingParams(greedy=True, max_new_tokens=max_new)
    outs = engine.generate(prompts, sampling_dicts(params, eos, request_seeds(1, len(prompts))))
    parsed = parse_outputs(outs, prompts, pad)
    return real_tokens(parsed.response_ids, parsed.response_mask)


def hf_greedy(model, prompts, eos: list[int], pad: int, max_new: int = 12) -> list[list[int]]:
    params = SamplingParams(greedy=True, max_new_tokens=max_new)
    out = sample(model, prompts, params, eos_token_ids=eos, pad_token_id=pad)
    return real_tokens(out.response_ids, out.response_mask)


# greedy_regret's margin for a bf16 engine's kernels over HF's own bf16 greedy path (bf16_regret_bar):
# the tiny engine's bf16 logprobs differ from HF's by ~3e-3 on average; a wrong weight shows as a
# gap of order 1
GREEDY_REGRET_BF16 = 0.05


def bf16_regret_bar(
    reference, prompts: list[list[int]], hf_bf16_rows: list[list[int]]
) -> tuple[float, float]:
    """(bar, HF's regret): the largest greedy_regret under `reference` (an fp32 model) that a bf16
    engine's greedy rows may have. What bf16 alone does to these weights is measured on HF's own bf16
    greedy rows (an independent bf16 implementation; on a random-init checkpoint it reaches 0.07),
    and the engine may stray GREEDY_REGRET_BF16 further."""
    hf_regret = greedy_regret(reference, prompts, hf_bf16_rows)
    return hf_regret + GREEDY_REGRET_BF16, hf_regret


def greedy_regret(model, prompts: list[list[int]], rows: list[list[int]]) -> float:
    """How far `rows` (greedy continuations of `prompts` from another implementation) stray from
    `model`'s own greedy choice: the largest gap, over every generated position, between the
    model's top logprob there and its logprob of the token the row holds (0: the model's own greedy
    path). A random-init model has near-ties that bf16 kernels break either way, so one token's
    flip makes two greedy paths differ entirely while every step stays within bf16 noise."""
    worst, device = 0.0, next(model.parameters()).device
    with torch.no_grad():
        for prompt, row in zip(prompts, rows, strict=True):
            if not row:
                continue
            ids = torch.tensor([prompt + row], device=device)
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            lp = logits.log_softmax(-1)
            taken = lp.gather(-1, torch.tensor(row, device=device)[:, None])[:, 0]
            worst = max(worst, float((lp.max(-1).values - taken).max()))
    return worst
