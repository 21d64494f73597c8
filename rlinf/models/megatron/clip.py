"""Gradient clipping of a megatron-core (chained) optimizer by a norm already read on the host.

megatron-core's `optimizer.step()` prepares the grads, takes the global grad norm and clips on
every call (optimizer/optimizer.py MixedPrecisionOptimizer.step, ChainedOptimizer.step). The actor
needs the norm before the step anyway (non-finite steps are skipped on every rank alike), so it
prepares the grads and reads the norm once (`prepare_grads`, `get_grad_norm`), clips here only
when the coefficient is below 1, then calls `step_with_ready_grads()`. With Transformer Engine
megatron's own clip keeps the norm on the device and launches its scale kernel even when the
coefficient clamps to 1; from a host float it decides on the host, as this does.
"""

from __future__ import annotations

from rlinf.models.megatron.adam_state import optimizer_parts

# megatron's clip_grad_by_total_norm_fp32 divides by total_norm + this (clip_grads.py)
NORM_EPSILON = 1.0e-6


def clip_coefficient(max_norm: float, total_norm: float) -> float:
    return max_norm / (total_norm + NORM_EPSILON)


def clip_main_grads(optimizer, max_norm: float, total_norm: float) -> bool:
    """Scale the main grads of every part of `optimizer` by max_norm / total_norm when that is
    below 1, as megatron's step would (max_norm <= 0: no clipping); whether it did. The actor
    builds no MTP layers, so no parameter is in a separate grad-norm group."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    if max_norm <= 0.0 or clip_coefficient(max_norm, total_norm) >= 1.0:
        return False
    for part in optimizer_parts(optimizer):
        if getattr(part, "is_stub_optimizer", False) or not (params := part.get_parameters()):
            continue
        clip_grad_by_total_norm_fp32(
            params,
            max_norm,
            total_norm,
            use_decoupled_grad=part.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8,
        )
    return True
