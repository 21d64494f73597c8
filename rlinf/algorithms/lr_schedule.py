"""The LR schedule both actors use, as a multiplier of the base LR per optimizer step."""

from __future__ import annotations

from collections.abc import Callable


def lr_multiplier(decay_style: str, warmup_steps: int) -> Callable[[int], float]:
    """`warmup_constant`: linear warmup to 1 over `warmup_steps` optimizer steps, then 1;
    `constant`: always 1."""

    def multiplier(optimizer_step: int) -> float:
        if decay_style == "warmup_constant" and warmup_steps > 0:
            return min(1.0, (optimizer_step + 1) / warmup_steps)
        return 1.0

    return multiplier
