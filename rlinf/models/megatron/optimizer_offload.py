"""The distributed optimizer's state to CPU and back, between the colocated actor's phases.

megatron-core's `MegatronOptimizer.offload_to_cpu` re-points every parameter of the inner
optimizer (`p.data = p.data.cpu()`). On the fp32 path those are fp32 master shards that own their
memory, which is fine. With the precision-aware optimizer (Transformer Engine's FusedAdam) they are
views into the DDP parameter buffer, i.e. the model's own bf16 weights, which FusedAdam updates in
place: after the DDP buffer's offload their storage is empty, and re-pointing them would detach the
optimizer from the model for good. Here only tensors that own their storage move (master shards,
Adam moments, TE's fp32 masters or their 16-bit remainders); the views follow the DDP buffer's own
offload and reload, which keeps its storage object.
"""

from __future__ import annotations

from typing import Any

import torch

from rlinf.models.megatron.adam_state import optimizer_parts


def owned_tensors(optimizer: Any):
    """(tensor, put) for every tensor of `optimizer`'s inner optimizers that owns its storage;
    `put(new)` puts `new` in its place."""
    for part in optimizer_parts(optimizer):
        inner = getattr(part, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            for p in group["params"]:
                if p._base is None:
                    yield p, lambda new, p=p: setattr(p, "data", new)
        for state in inner.state.values():
            for key, value in state.items():
                if torch.is_tensor(value):
                    yield value, lambda new, state=state, key=key: state.__setitem__(key, new)


def move_optimizer_state(optimizer: Any, device: torch.device) -> None:
    for tensor, put in list(owned_tensors(optimizer)):
        if tensor.device != device:
            put(tensor.to(device))


def offload_optimizer_state(optimizer: Any) -> None:
    move_optimizer_state(optimizer, torch.device("cpu"))
    torch.cuda.empty_cache()


def restore_optimizer_state(optimizer: Any) -> None:
    move_optimizer_state(optimizer, torch.device("cuda", torch.cuda.current_device()))
