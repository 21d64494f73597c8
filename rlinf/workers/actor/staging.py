"""Host <-> device traffic of the actor in as few transfers as possible.

Every pageable `.to(cuda)` is a copy plus a stream sync, and every `float(tensor)` a sync: on a
GPU-bound train call these idle the GPU while the host catches up. So:
- `to_device_once(tensors, device)` packs many host tensors (any dtypes) into one byte buffer,
  pinned when the device is a GPU, and moves it in one non-blocking copy; the results are views of
  the one device buffer. On the CPU the same packing runs (no pinning), so the CPU tests exercise it.
- `scalars_to_host(dicts)` reads the scalar tensors of many metric dicts back in one transfer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

ALIGN = 16  # bytes: each tensor starts at an offset a view of any dtype accepts


def _pinned(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


def to_device_once(tensors: Sequence[torch.Tensor | None], device: torch.device) -> list[torch.Tensor | None]:
    """`tensors` (host, None allowed) on `device`, moved in one copy; None stays None."""
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        if t is not None:
            total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    host = torch.empty(total, dtype=torch.uint8, pin_memory=_pinned(device))
    for t, start in zip(tensors, offsets, strict=True):
        if t is not None and t.numel():
            nbytes = t.numel() * t.element_size()
            host[start : start + nbytes].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    moved = host.to(device, non_blocking=_pinned(device))
    out: list[torch.Tensor | None] = []
    for t, start in zip(tensors, offsets, strict=True):
        if t is None:
            out.append(None)
            continue
        nbytes = t.numel() * t.element_size()
        out.append(moved[start : start + nbytes].view(t.dtype).view(t.shape))
    return out


def scalars_to_host(dicts: Sequence[Mapping[str, torch.Tensor | float]]) -> list[dict[str, float]]:
    """`dicts` with every tensor value read as a Python float, all in one device->host transfer
    (float64 on the way: a float32 value reads exactly as `float(tensor)` would)."""
    tensors = [v.detach().reshape(()) for d in dicts for v in d.values() if isinstance(v, torch.Tensor)]
    device = tensors[0].device if tensors else None
    values = iter(torch.stack([t.to(device).double() for t in tensors]).tolist() if tensors else [])
    return [
        {k: next(values) if isinstance(v, torch.Tensor) else float(v) for k, v in d.items()} for d in dicts
    ]
