"""Token logprobs and entropy of the tempered distribution from vocab-parallel logits.

Megatron's output layer leaves each tensor-parallel rank with a slice of the vocabulary,
logits [..., V / TP] (this rank holds token ids [vocab_start, vocab_start + V / TP)). This module
computes, per position, log softmax(logits / T)[target] and the entropy of softmax(logits / T) over
the FULL vocabulary, exactly the rollout's convention (rlinf.models.logprobs.scale_logits), with
two all-reduces over the TP group in the forward and none in the backward.

Memory: the logits are read in chunks of positions, each upcast to fp32 only for the chunk, so no
full-vocabulary fp32 copy of the whole [positions, V / TP] tensor is made, in the forward or the
backward (which recomputes the chunk's softmax from the saved logits and the per-position
log-partition and entropy). megatron-core's vocab_parallel_cross_entropy would also work for the
logprob but changes fp32 logits in place, has no temperature and no entropy.

On a GPU the per-slice work runs in rlinf.models.megatron.logprobs_triton's kernels instead: one
read of the logits in the forward, one read and one write in the backward, two launches in all
(the chunked torch path makes about a dozen full passes and launches per chunk). Both paths share
the tensor-parallel combination here. The torch path serves CPU tensors and a GPU without Triton;
the CPU tests check the kernels under Triton's interpreter against it.
"""

from __future__ import annotations

import os
from types import ModuleType

import torch
import torch.distributed as dist

# Positions per chunk are chosen so a chunk's fp32 working set stays near this many bytes.
CHUNK_BYTES = 256 * 2**20


def _chunks(num_positions: int, vocab_local: int) -> list[slice]:
    size = max(1, CHUNK_BYTES // (4 * max(1, vocab_local)))
    return [slice(s, min(s + size, num_positions)) for s in range(0, num_positions, size)]


def _all_reduce(tensor: torch.Tensor, op, group) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


class _VocabParallelLogprobEntropy(torch.autograd.Function):
    """The softmax over 160k-token vocabularies is memory-bound, so every full-size pass counts: the
    kernels make one (two in the backward), and the chunked torch path does each chunk's fp32 work
    in place on one upcast copy where it can. An output the loss does not use (the entropy, when it
    is only a metric) costs no pass in either backward: the kernel's takes its gradient as zeros."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, vocab_start, group):
        ctx.set_materialize_grads(False)
        shape = targets.shape
        flat = logits.reshape(-1, logits.shape[-1])
        tgt = targets.reshape(-1)
        n, v_local = flat.shape
        inv_t = 1.0 / temperature
        local_target = tgt - vocab_start
        owned = (local_target >= 0) & (local_target < v_local)
        local_target = local_target.clamp(0, v_local - 1)

        kernels = _kernels(flat)
        if kernels is None:
            row_max, stats = _chunked_stats(flat, local_target, owned, inv_t, group)
        else:
            row_max, stats = _fused_stats(kernels, flat, local_target, owned, inv_t, group)
        _all_reduce(stats, dist.ReduceOp.SUM, group)

        log_sum = torch.log(stats[0])
        logprobs = stats[2] - log_sum
        entropy = log_sum - stats[1] / stats[0]
        log_z = row_max + log_sum
        ctx.save_for_backward(logits, local_target, owned, log_z, entropy)
        ctx.inv_t = inv_t
        return logprobs.reshape(shape), entropy.reshape(shape)

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None
        logits, local_target, owned, log_z, entropy = ctx.saved_tensors
        inv_t = ctx.inv_t
        flat = logits.reshape(-1, logits.shape[-1])
        g_lp = None if grad_logprobs is None else grad_logprobs.reshape(-1).float()
        g_h = None if grad_entropy is None else grad_entropy.reshape(-1).float()
        kernels = _kernels(flat)
        if kernels is None:
            grad = _chunked_grad(flat, local_target, owned, log_z, entropy, g_lp, g_h, inv_t)
        else:
            # one float per row, read at its index: an incoming gradient may be an expanded scalar
            g_lp, g_h = (torch.zeros_like(log_z) if g is None else g.contiguous() for g in (g_lp, g_h))
            target = torch.where(owned, local_target, -1)
            grad = kernels.slice_grad(flat, log_z, entropy, g_lp, g_h, target, inv_t)
        return grad.reshape(logits.shape), None, None, None, None


def _kernels(flat: torch.Tensor) -> ModuleType | None:
    """The Triton kernels when they serve these logits: CUDA tensors with Triton importable, or any
    tensor under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    if not (flat.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    try:
        from rlinf.models.megatron import logprobs_triton
    except ImportError:
        return None
    return logprobs_triton


def _chunked_stats(flat, local_target, owned, inv_t, group) -> tuple[torch.Tensor, torch.Tensor]:
    """The global max of the scaled logits per position, and this slice's [3, n] sums (before the
    all-reduce): sum exp(d), sum exp(d) d and the target's d, with d = x / T - max."""
    n, v_local = flat.shape
    # Pass 1: global max of the scaled logits per position (exact in the logits' dtype).
    row_max = torch.empty(n, dtype=torch.float32, device=flat.device)
    for c in _chunks(n, v_local):
        row_max[c] = flat[c].amax(-1).float() * inv_t
    _all_reduce(row_max, dist.ReduceOp.MAX, group)

    # Pass 2: with d = x - max: sum exp(d), sum exp(d) * d and the target's d, reduced in one
    # call (sum exp(x - max) * x = that second sum + max * the first).
    stats = torch.zeros(3, n, dtype=torch.float32, device=flat.device)
    for c in _chunks(n, v_local):
        d = flat[c].to(torch.float32, copy=True)  # a copy also when the logits are fp32
        if inv_t != 1.0:
            d.mul_(inv_t)
        d.sub_(row_max[c, None])
        e = d.exp()
        stats[0, c] = e.sum(-1)
        stats[1, c] = e.mul_(d).sum(-1)
        picked = d.gather(-1, local_target[c, None]).squeeze(-1)
        stats[2, c] = torch.where(owned[c], picked, torch.zeros_like(picked))
    return row_max, stats


def _fused_stats(kernels, flat, local_target, owned, inv_t, group) -> tuple[torch.Tensor, torch.Tensor]:
    """`_chunked_stats` from the kernels' per-slice (m, s, u), each taken about the slice's own max:
    moved to the global max M, s becomes s e^(m - M) and u becomes e^(m - M) (u + (m - M) s)."""
    m, s, u = kernels.slice_stats(flat, inv_t)
    row_max = _all_reduce(m.clone(), dist.ReduceOp.MAX, group)
    shift = m - row_max
    scale = shift.exp()
    picked = flat.gather(-1, local_target[:, None]).squeeze(-1).float() * inv_t - row_max
    stats = torch.stack(
        [s * scale, scale * (u + shift * s), torch.where(owned, picked, torch.zeros_like(picked))]
    )
    return row_max, stats


def _chunked_grad(flat, local_target, owned, log_z, entropy, g_lp, g_h, inv_t) -> torch.Tensor:
    n, v_local = flat.shape
    grad = torch.empty_like(flat)
    for c in _chunks(n, v_local):
        # d logp(target) / dx_k = 1[k = target] - p_k;  d H / dx_k = -p_k (log p_k + H)
        # so the chunk's gradient is -p_k * (g_lp + g_h (log p_k + H)) + g_lp 1[k = target],
        # all times 1 / T.
        logp = flat[c].to(torch.float32, copy=True)
        if inv_t != 1.0:
            logp.mul_(inv_t)
        logp.sub_(log_z[c, None])
        p = logp.exp()
        if g_h is None:
            g = p.mul_(-g_lp[c, None] * inv_t)
        else:
            coef = logp.add_(entropy[c, None]).mul_(g_h[c, None])
            if g_lp is not None:
                coef.add_(g_lp[c, None])
            g = coef.mul_(p).mul_(-inv_t)
        if g_lp is not None:
            hit = torch.where(owned[c], g_lp[c], torch.zeros_like(g_lp[c])) * inv_t
            g.scatter_add_(-1, local_target[c, None], hit[:, None])
        grad[c] = g
    return grad


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    vocab_start: int = 0,
    group=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropy), each shaped like `targets`, of the distribution softmax(logits / T).

    logits [..., V_local]: this rank's vocabulary slice starting at token id `vocab_start`;
    targets [...] long: global token ids. `group`: the tensor-parallel process group (None or a
    one-rank group: no communication). temperature <= 0 (greedy) reports temperature 1, like the
    rollout. Differentiable in logits (both outputs).
    """
    t = temperature if temperature > 0 else 1.0
    return _VocabParallelLogprobEntropy.apply(logits, targets, t, vocab_start, group)
