"""The TE-free precision-aware optimizer: CompactAdamW inside megatron-core's distributed optimizer.

megatron-core's precision-aware path (bf16 Adam moments) runs only on Transformer Engine's
FusedAdam. Without TE, megatron-core builds torch.optim.AdamW over the distributed optimizer's
fp32 master shards. `use_compact_adamw` replaces that inner AdamW, before its first step, with
CompactAdamW over the very same param groups (the shards, their lr / weight-decay multipliers),
and makes megatron's state initialiser (run before a checkpoint load) allocate the moments in
their storage dtypes. Everything else (grad copy into fp32 shards, clipping, the param gather,
offload, sharded checkpoints) stays megatron-core's: CompactAdamW keeps torch AdamW's state layout.
"""

from __future__ import annotations

from typing import Any

import torch

from rlinf.models.megatron.adam_state import optimizer_parts
from rlinf.models.megatron.compact_adamw import CompactAdamW


def _init_compact_states(optimizer: CompactAdamW, config: Any = None) -> None:
    optimizer.init_all_states()


def use_compact_adamw(optimizer: Any, exp_avg_dtype: str, exp_avg_sq_dtype: str) -> int:
    """Swap the AdamW inside `optimizer` (a DistributedOptimizer or a ChainedOptimizer of them)
    for CompactAdamW; returns how many were swapped."""
    parts = optimizer_parts(optimizer)
    for part in parts:
        inner = part.optimizer
        if type(inner) is not torch.optim.AdamW or inner.state:
            raise RuntimeError(
                f"use_compact_adamw: expected megatron-core's fresh torch AdamW, found {type(inner).__name__}"
                f"{' with state' if inner.state else ''} (is Transformer Engine or apex installed?)"
            )
        group = inner.defaults
        part.optimizer = CompactAdamW.over_groups(
            inner.param_groups,
            lr=group["lr"],
            betas=group["betas"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            exp_avg_dtype=exp_avg_dtype,
            exp_avg_sq_dtype=exp_avg_sq_dtype,
        )
        part.init_state_fn = _init_compact_states
    return len(parts)
