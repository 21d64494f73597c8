"""Masked reductions over response tokens.

Padded slots are selected away with `torch.where` rather than multiplied by zero, so a NaN or inf
sitting in padding cannot leak into a sum (NaN * 0 is NaN).
"""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, values, torch.zeros_like(values)).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the True slots of `mask`; 0 when there are none."""
    return masked_sum(values, mask) / mask.sum().clamp(min=1)


def masked_max(values: torch.Tensor, mask: torch.Tensor, empty: float = 0.0) -> torch.Tensor:
    """Max over the True slots of `mask`; `empty` when there are none."""
    largest = torch.where(mask, values, torch.full_like(values, float("-inf"))).amax()
    return torch.where(mask.any(), largest, torch.full_like(largest, empty))
