"""AdamW with its two moments stored in bf16, rounded stochastically; the maths runs in fp32.

What megatron-core's precision-aware optimizer does with Transformer Engine's FusedAdam, without
TE (which has no wheel for torch 2.11): the master weights stay fp32 (the distributed optimizer's
own shards), and only `exp_avg` / `exp_avg_sq` shrink from 8 to 4 bytes per parameter.

Why stochastic rounding: the second moment decays by beta2 = 0.999 per step, a relative change
of 1e-3, while bf16 spacing is 2^-8 (4e-3) relative. Rounded to nearest, `0.999 * v` rounds back
to `v`, so `exp_avg_sq` never decays: it only grows, like a running maximum, and the step size
shrinks for good after one large gradient. Rounded stochastically (up with probability equal to
the distance), every store is exact in expectation and the decay survives (tests/unit/
test_compact_adamw.py shows both). The random bits come from the default generator of the
parameter's device, which the actors' checkpoints save and restore, so a resumed run repeats.

State layout is torch.optim.AdamW's (`step` as a float32 tensor, `exp_avg`, `exp_avg_sq`), so
megatron-core's distributed optimizer saves, loads, offloads and reshards it like AdamW's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

STORE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MOMENTS = ("exp_avg", "exp_avg_sq")


def round_to_bf16_stochastically(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16, rounding up or down with probability proportional to the distance.

    bf16 is fp32 without its low 16 bits. Adding 16 random low bits to the bit pattern and then
    dropping them carries into the kept bits with probability (dropped bits) / 2^16. The sign bit
    is untouched (the pattern is sign + magnitude), so this is symmetric for negative values.
    """
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=x.device)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)


class CompactAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update, with `exp_avg` / `exp_avg_sq` kept in `exp_avg_dtype` /
    `exp_avg_sq_dtype` ("fp32" or "bf16"). Parameters (the master weights) must be fp32."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        *,
        exp_avg_dtype: str = "bf16",
        exp_avg_sq_dtype: str = "bf16",
    ) -> None:
        unknown = {exp_avg_dtype, exp_avg_sq_dtype} - set(STORE_DTYPES)
        if unknown:
            raise ValueError(
                f"CompactAdamW stores moments in {', '.join(STORE_DTYPES)}, not {sorted(unknown)}"
            )
        self.moment_dtypes = {
            "exp_avg": STORE_DTYPES[exp_avg_dtype],
            "exp_avg_sq": STORE_DTYPES[exp_avg_sq_dtype],
        }
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self._check_masters()

    @classmethod
    def over_groups(cls, param_groups: list[dict[str, Any]], **kwargs: Any) -> CompactAdamW:
        """CompactAdamW over param groups another optimizer already holds, kept as they are (the same
        list and dicts). megatron-core's distributed optimizer builds its inner optimizer this way:
        its fp32 master shards of an fp32 model are views of the parameters, non-leaf tensors that
        torch's optimizer constructor refuses, updated in place."""
        placeholder = torch.zeros(0, requires_grad=True)
        optimizer = cls([placeholder], **kwargs)
        defaults = optimizer.defaults
        for group in param_groups:
            for key, value in defaults.items():
                group.setdefault(key, value)
        optimizer.param_groups = param_groups
        optimizer._check_masters()
        return optimizer

    def _check_masters(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.float32:
                    raise ValueError(f"CompactAdamW updates fp32 master weights; got a {p.dtype} parameter")

    def init_state(self, p: torch.Tensor) -> None:
        """Zero moments in their storage dtypes (megatron-core calls this before loading a checkpoint)."""
        state = self.state[p]
        if "exp_avg" not in state:
            state["step"] = torch.tensor(0.0)
            for key in MOMENTS:
                state[key] = torch.zeros_like(
                    p, dtype=self.moment_dtypes[key], memory_format=torch.preserve_format
                )

    def init_all_states(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.init_state(p)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's loader casts every state tensor to its parameter's dtype (fp32); cast back."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in MOMENTS:
                if key in state and state[key].dtype != self.moment_dtypes[key]:
                    state[key] = state[key].to(self.moment_dtypes[key])

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                self.init_state(p)
                state = self.state[p]
                # not in place: megatron's checkpoint load hands every parameter the same step tensor
                state["step"] = state["step"] + 1
                t = state["step"].item()
                grad = p.grad.float()
                exp_avg = state["exp_avg"].float().lerp_(grad, 1 - beta1)
                exp_avg_sq = state["exp_avg_sq"].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                p.mul_(1 - lr * weight_decay)
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                p.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**t))
                for key, value in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                    if value is not state[key]:  # a bf16 moment (an fp32 one was updated in place)
                        state[key] = round_to_bf16_stochastically(value)
        return loss
