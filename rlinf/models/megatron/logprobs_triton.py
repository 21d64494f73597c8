"""Triton kernels for rlinf.models.megatron.logprobs: the per-position softmax statistics of a
vocabulary slice in one read of the logits, and the gradient in one read and one write.

The torch path works chunk by chunk on fp32 copies: about a dozen memory-bound passes and as many
kernel launches per chunk over [positions, V / TP] (Moonlight: 163,840 columns at TP=1). Here each
program owns one position and streams its row of logits once, in blocks, keeping an online softmax
in fp32 registers (the running max m, s = sum exp(x - m) and u = sum exp(x - m) (x - m), rescaled
whenever the max grows), with x the logits times 1 / T. The tensor-parallel combination of the
per-slice statistics stays in torch (logprobs.py): they are a few floats per position.

Runs wherever Triton runs: CUDA tensors, or CPU tensors under Triton's interpreter
(TRITON_INTERPRET=1 before this module is imported), which the CPU tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # columns a program reads per step: 8 KiB of bf16 logits
NUM_WARPS = 8


@triton.jit
def _slice_stats_kernel(logits_ptr, row_stride, m_ptr, s_ptr, u_ptr, num_cols, inv_t, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * row_stride
    m = float("-inf")
    s = 0.0
    u = 0.0
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < num_cols
        x = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m, tl.max(x, 0))
        scale = tl.exp(m - m_new)  # 0 on the first block (m = -inf)
        d = tl.where(inside, x - m_new, 0.0)
        e = tl.where(inside, tl.exp(d), 0.0)
        # the old u was taken about m: moving it to m_new adds (m - m_new) s; nothing to move at first
        moved = tl.where(s > 0.0, u + (m - m_new) * s, 0.0)
        u = scale * moved + tl.sum(e * d, 0)
        s = scale * s + tl.sum(e, 0)
        m = m_new
    tl.store(m_ptr + row, m)
    tl.store(s_ptr + row, s)
    tl.store(u_ptr + row, u)


@triton.jit
def _slice_grad_kernel(
    logits_ptr, row_stride, grad_ptr, grad_row_stride, log_z_ptr, entropy_ptr, g_lp_ptr, g_h_ptr,
    target_ptr, num_cols, inv_t, BLOCK: tl.constexpr,
):  # fmt: skip
    # d logp(target) / dx_k = 1[k = target] - p_k;  d H / dx_k = -p_k (log p_k + H); times 1 / T
    row = tl.program_id(0).to(tl.int64)
    logits_row, grad_row = logits_ptr + row * row_stride, grad_ptr + row * grad_row_stride
    log_z = tl.load(log_z_ptr + row)
    entropy = tl.load(entropy_ptr + row)
    g_lp = tl.load(g_lp_ptr + row)
    g_h = tl.load(g_h_ptr + row)
    target = tl.load(target_ptr + row)  # -1: the target is on another rank's slice
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < num_cols
        x = tl.load(logits_row + cols, mask=inside, other=0.0).to(tl.float32)
        logp = x * inv_t - log_z
        p = tl.exp(logp)
        g = -p * (g_lp + g_h * (logp + entropy)) + tl.where(cols == target, g_lp, 0.0)
        out = (g * inv_t).to(grad_ptr.dtype.element_ty, fp_downcast_rounding="rtne")  # as torch rounds
        tl.store(grad_row + cols, out, mask=inside)


def slice_stats(flat: torch.Tensor, inv_t: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of `flat` [n, V_local]: (m, s, u), fp32 [n] each, of x = flat / T: m = max x,
    s = sum exp(x - m), u = sum exp(x - m) (x - m)."""
    flat = _unit_column_stride(flat)
    n, num_cols = flat.shape
    m, s, u = (torch.empty(n, dtype=torch.float32, device=flat.device) for _ in range(3))
    if n:
        _slice_stats_kernel[(n,)](
            flat, flat.stride(0), m, s, u, num_cols, inv_t, BLOCK=_block(num_cols), num_warps=NUM_WARPS
        )
    return m, s, u


def slice_grad(
    flat: torch.Tensor,
    log_z: torch.Tensor,
    entropy: torch.Tensor,
    g_lp: torch.Tensor,
    g_h: torch.Tensor,
    local_target: torch.Tensor,
    inv_t: float,
) -> torch.Tensor:
    """The gradient of sum(g_lp * logprob + g_h * entropy) with respect to `flat` [n, V_local], in
    its dtype. log_z, entropy, g_lp, g_h: fp32 [n]; local_target: int [n], -1 where the target
    lies outside this slice."""
    flat = _unit_column_stride(flat)
    grad = torch.empty(flat.shape, dtype=flat.dtype, device=flat.device)  # contiguous, whatever flat's rows
    n, num_cols = flat.shape
    if n:
        _slice_grad_kernel[(n,)](
            flat, flat.stride(0), grad, grad.stride(0), log_z, entropy, g_lp, g_h, local_target,
            num_cols, inv_t, BLOCK=_block(num_cols), num_warps=NUM_WARPS,
        )  # fmt: skip
    return grad


def _block(num_cols: int) -> int:
    return min(BLOCK, triton.next_power_of_2(max(num_cols, 16)))


def _unit_column_stride(flat: torch.Tensor) -> torch.Tensor:
    """The kernels step along a row one element at a time and between rows by a row stride of
    their own (a tensor-parallel slice of wider logits is read in place)."""
    return flat if flat.stride(-1) == 1 else flat.contiguous()
