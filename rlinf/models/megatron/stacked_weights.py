"""The weights of one projection of all local experts as one [experts, out, in] tensor, without a copy
where megatron-core's DDP has laid them out back to back, and their gradient added into DDP's
`main_grad` buffer in one kernel.

Under DDP every parameter lives in a contiguous buffer, and so does its `main_grad`. When the
experts' weights sit there one after another at a fixed step, `back_to_back` is a strided view of
the buffer, so the grouped GEMM reads the weights where they are (instead of `torch.stack`, a copy of
every expert weight kept for the backward: 1.1 GB per Moonlight MoE layer in bf16). In the backward,
the stacked gradient is added into the stacked view of the `main_grad`s at once, instead of one
gradient tensor per expert that DDP's hook then adds into its `main_grad` (two kernels per expert,
projection and micro-batch). The weights then get no `.grad` and DDP's per-parameter hook does not
run: that is only right where the hook has nothing else to do, without `overlap_grad_reduce` (whose
hook counts ready parameters); `stacked` takes the copying path there. The views are found once,
when DDP has wrapped the model (`in_place`), not on every forward. DDP lays parameters out in
the reverse of their registration order, which is why `ExpertLinears` registers its weights last to
first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGNMENT = 16  # bytes


def back_to_back(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """`tensors` as one [n, *shape] view of their common storage when each one is contiguous, all
    have one shape and dtype, and each starts a fixed number of elements after the previous one (at
    least its size: DDP may pad between parameters) at a 16-byte aligned address; else None."""
    first = tensors[0]
    if not all(
        t.shape == first.shape and t.dtype == first.dtype and t.device == first.device and t.is_contiguous()
        for t in tensors
    ):
        return None
    if len(tensors) == 1:
        return first.unsqueeze(0)
    storage = first.untyped_storage()
    if not all(t.untyped_storage().data_ptr() == storage.data_ptr() for t in tensors):
        return None
    step = tensors[1].storage_offset() - first.storage_offset()
    offsets = [t.storage_offset() for t in tensors]
    if step < first.numel() or any(b - a != step for a, b in zip(offsets[:-1], offsets[1:], strict=True)):
        return None
    if first.data_ptr() % ALIGNMENT or (step * first.element_size()) % ALIGNMENT:
        return None  # grouped GEMMs want every expert's weight 16-byte aligned
    return first.as_strided((len(tensors), *first.shape), (step, *first.stride()), first.storage_offset())


class _StackedWeights(torch.autograd.Function):
    """Forward: the weights' stacked view. Backward: the stacked gradient added into the stacked
    view of their `main_grad`s; the weights themselves get no gradient."""

    @staticmethod
    def forward(ctx, stacked_data: torch.Tensor, stacked_main_grad: torch.Tensor, *weights: torch.Tensor):
        ctx.stacked_main_grad = stacked_main_grad
        ctx.weights = len(weights)
        return stacked_data.view_as(stacked_data)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.stacked_main_grad.add_(grad)
        return (None, None, *([None] * ctx.weights))


@dataclass(frozen=True)
class InPlace:
    """Views of one projection's expert weights where DDP's buffers hold them, found once: DDP never
    moves a parameter after wrapping it (offloading resizes the same storage)."""

    data: torch.Tensor  # [n, out, in]: the weights
    main_grad: torch.Tensor | None  # the same over their `main_grad`s; None: autograd's grads instead


def in_place(weights: list[torch.Tensor], *, grad_into_main_grad: bool) -> InPlace | None:
    """The views of `weights` (None where they are not back to back); with `grad_into_main_grad`
    (DDP without `overlap_grad_reduce`) also of their `main_grad`s."""
    data = back_to_back([w.detach() for w in weights])
    if data is None:
        return None
    main_grad = None
    if grad_into_main_grad and all(hasattr(w, "main_grad") for w in weights):
        main_grad = back_to_back([w.main_grad for w in weights])
    return InPlace(data, main_grad)


def stacked(weights: list[torch.Tensor], views: InPlace | None) -> torch.Tensor:
    """The weights as [n, out, in] for a grouped GEMM: the `views` of DDP's buffer, the gradient added
    into `main_grad` at once where they hold one; else `torch.stack`, a copy whose gradient autograd
    splits per weight (also should a weight no longer be where the views were taken)."""
    if views is None or views.data.data_ptr() != weights[0].data_ptr():
        return torch.stack(weights)
    if not torch.is_grad_enabled() or not any(w.requires_grad for w in weights):
        return views.data
    if views.main_grad is None:
        return torch.stack(weights)
    return _StackedWeights.apply(views.data, views.main_grad, *weights)
