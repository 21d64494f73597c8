"""megatron-core's multi-tensor gradient ops without Transformer Engine or apex, on torch's fused
`_foreach` kernels.

Why: without TE or apex, megatron-core 0.19.2 falls back to `megatron.core.utils.local_multi_tensor_*`,
whose L2 norm reads every per-tensor norm back to the host (one device->host sync per parameter
tensor, per grad norm) and whose scale is a Python loop. The versions here keep the
contracts (`op(chunk_size, noop_flag, tensor_lists, *args)`, as `multi_tensor_applier` calls them)
and run as a few fused launches with no host read:
- `foreach_l2_norm`: the global L2 norm of `tensor_lists[0]` as a one-element fp32 CUDA tensor (the
  per-tensor norms are taken in fp32 whatever the grads' dtype, so bf16 grads lose nothing);
- `foreach_scale`: `dst = src * scale` for `[src, dst]` lists, in place when they are the same list.

`install()` swaps them into megatron's modules only where megatron chose its local fallbacks, so
with TE or apex present nothing changes. Effect on the actor's speed: docs/megatron.md.
"""

from __future__ import annotations

import torch


def foreach_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Global L2 norm of the tensors in `tensor_lists[0]`: ([1] fp32 tensor on their device, None)."""
    tensors = [t for t in tensor_lists[0] if t.numel() > 0]
    if not tensors:
        device = tensor_lists[0][0].device if tensor_lists[0] else torch.device("cuda")
        return torch.zeros(1, dtype=torch.float32, device=device), None
    norms = torch._foreach_norm(tensors, 2, dtype=torch.float32)
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None


def foreach_scale(chunk_size, noop_flag, tensor_lists, scale):
    """dst = src * scale elementwise for every pair of `tensor_lists = [src, dst]` (dtype cast on copy)."""
    src, dst = tensor_lists[0], tensor_lists[1]
    if not src:
        return
    if all(s is d for s, d in zip(src, dst, strict=True)):
        torch._foreach_mul_(dst, scale)
    elif scale == 1.0:
        torch._foreach_copy_(dst, src)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


def install() -> list[str]:
    """Point megatron-core's optimizer modules at the foreach ops where they hold its local
    fallbacks; returns the names replaced (empty with TE or apex)."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    replaced = []
    for module in (clip_grads, optimizer):
        if getattr(module, "l2_norm_impl", None) is utils.local_multi_tensor_l2_norm:
            module.l2_norm_impl = foreach_l2_norm
            replaced.append(f"{module.__name__}.l2_norm_impl")
        if getattr(module, "multi_tensor_scale_impl", None) is utils.local_multi_tensor_scale:
            module.multi_tensor_scale_impl = foreach_scale
            replaced.append(f"{module.__name__}.multi_tensor_scale_impl")
    return replaced
