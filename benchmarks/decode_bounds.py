"""The arithmetic behind benchmarks/rollout_decode.py: the memory-bandwidth bounds of a decode step,
the response lengths of its long-generation runs, and the tail report of such a run. Pure Python,
tested on the CPU (tests/unit/test_decode_bounds.py).

A decode step of `batch` sequences reads, at the least:
- every weight byte except the input embedding table, of which it reads `batch` rows (the weights
  bound; with 64 experts top-6, a batch of 64 tokens leaves an expert untouched with odds
  (58/64)^64 ~ 0.2%, so every expert counts);
- the KV cache of every sequence over its whole context (the weights + KV bound). An MLA engine
  (SGLang) caches per token and layer the compressed latent and the shared rope key:
  (kv_lora_rank + qk_rope_head_dim) x dtype bytes. Over a decode of `new_tokens` after `prompt_len`,
  the average context is prompt_len + new_tokens / 2.
Bound tokens/s = batch x bandwidth / bytes read per step.
"""

from __future__ import annotations

import math
import random


def kv_bytes_per_token(hf_config: dict, dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token holds over all layers of an MLA model."""
    return (
        hf_config["num_hidden_layers"]
        * (hf_config["kv_lora_rank"] + hf_config["qk_rope_head_dim"])
        * dtype_bytes
    )


def decode_bounds(
    batch: int,
    prompt_len: int,
    new_tokens: int,
    weight_bytes_read: float,
    kv_token_bytes: float,
    bandwidth: float,
) -> dict[str, float]:
    """The bounds of one batch's decode steps (bytes, bytes/s in; tokens/s and GiB out)."""
    kv_read = batch * (prompt_len + new_tokens / 2) * kv_token_bytes
    return {
        "bound_tokens_per_s": round(batch * bandwidth / weight_bytes_read, 1),
        "kv_bound_tokens_per_s": round(batch * bandwidth / (weight_bytes_read + kv_read), 1),
        "kv_read_per_step_GiB": round(kv_read / 2**30, 3),
    }


# Response lengths of the long-generation runs. Random weights never sample EOS, so each request
# gets its own max_new_tokens (with ignore_eos): log-normal, median max/3, sigma 0.7, capped at the
# max (about 6% of the requests reach it), the right-skewed shape of RL responses on math.
LENGTH_MEDIAN_SHARE = 1 / 3
LENGTH_SIGMA = 0.7


def response_lengths(count: int, max_new_tokens: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    median = max_new_tokens * LENGTH_MEDIAN_SHARE
    return [
        max(1, min(max_new_tokens, round(median * math.exp(rng.gauss(0.0, LENGTH_SIGMA)))))
        for _ in range(count)
    ]


def time_until_share(finish_seconds: list[float], share: float) -> float:
    """When `share` of the items had finished (the ceil(share x n)-th finish)."""
    ordered = sorted(finish_seconds)
    return ordered[max(1, math.ceil(share * len(ordered))) - 1]


def tail_report(finish_seconds: list[float], lengths: list[int], group_size: int, share: float) -> dict:
    """One batch submitted at 0 whose request i finished at finish_seconds[i] with lengths[i] new
    tokens; requests i*group_size .. (i+1)*group_size - 1 form a GRPO group. The tail: the time
    from when `share` of the requests (or of the groups: a group finishes with its last member)
    had finished until the last one did, and its share of the whole step."""
    if len(finish_seconds) != len(lengths) or len(lengths) % group_size:
        raise ValueError(
            f"{len(finish_seconds)} finish times, {len(lengths)} lengths, groups of {group_size}"
        )
    step = max(finish_seconds)
    groups = [max(finish_seconds[i : i + group_size]) for i in range(0, len(finish_seconds), group_size)]
    at_requests = time_until_share(finish_seconds, share)
    at_groups = time_until_share(groups, share)
    pct = round(100 * share)
    return {
        "step_seconds": round(step, 3),
        "new_tokens_total": sum(lengths),
        "tokens_per_s": round(sum(lengths) / step, 1),
        f"seconds_at_{pct}pct_requests": round(at_requests, 3),
        "tail_share_of_step": round((step - at_requests) / step, 4),
        f"seconds_at_{pct}pct_groups": round(at_groups, 3),
        "group_tail_share_of_step": round((step - at_groups) / step, 4),
        "longest_response": max(lengths),
        f"p{pct}_response": sorted(lengths)[max(1, math.ceil(share * len(lengths))) - 1],
    }
