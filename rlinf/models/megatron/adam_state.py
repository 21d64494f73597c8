"""Adam's per-parameter state inside megatron-core's (chained) distributed optimizer, where the
TE-free path needs it mended around checkpoints (rlinf.workers.actor.megatron_actor).

Without Transformer Engine the inner optimizers are torch AdamW or rlinf's CompactAdamW, whose
states hold `step`, `exp_avg` and `exp_avg_sq` per parameter. megatron-core 0.19.2 trips over
that `step` twice:
- `DistributedOptimizer.state_dict()` reads every parameter's `step` and asserts they agree,
  before its own state initialiser runs (which makes no `step`): a fresh optimizer (a resume in a
  new process) or one that never stepped failed with a bare AssertionError -> `ensure_adam_states`;
- its dp_reshardable load takes the 0-dim `step` from the *current* state (it is no
  ShardedTensor, so the template's value comes back): a reload in the same process kept the
  later count, a fresh CompactAdamW restarted at 0 -> the count is saved (`adam_step_count`) and
  put back (`set_adam_steps`).
TE's FusedAdam keeps its step in the param groups, which megatron restores itself.
"""

from __future__ import annotations

from typing import Any

import torch


def optimizer_parts(optimizer: Any) -> list:
    """The DistributedOptimizers of a ChainedOptimizer (or the optimizer itself)."""
    return getattr(optimizer, "chained_optimizers", None) or [optimizer]


def adam_states(optimizer: Any) -> list[dict]:
    """Every parameter's state in the torch optimizers inside `optimizer`."""
    return [state for part in optimizer_parts(optimizer) for state in part.optimizer.state.values()]


def adam_step_count(optimizer: Any) -> int:
    """Adam's step count, as its bias correction sees it (every parameter steps together); 0 before
    the first step. It can trail the loop's optimizer steps where megatron skips an update itself
    (fp16 loss-scale overflow)."""
    return int(max((float(s["step"]) for s in adam_states(optimizer) if "step" in s), default=0))


def ensure_adam_states(optimizer: Any) -> None:
    """Zero moments and step 0 (what a fresh Adam holds) for every parameter without a state."""
    for part in optimizer_parts(optimizer):
        part.init_state_fn(part.optimizer, part.config)
        for state in part.optimizer.state.values():
            state.setdefault("step", torch.tensor(0.0))


def set_adam_steps(optimizer: Any, steps: int) -> None:
    for state in adam_states(optimizer):
        if "step" in state:
            state["step"] = torch.tensor(float(steps))
