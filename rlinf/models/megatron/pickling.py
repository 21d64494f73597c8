"""Keep tensors pickled in a Megatron process loadable without megatron-core.

`import megatron.core` (0.19) replaces `torch.storage._load_from_bytes` with its own weights-only
loader, `megatron.core.safe_globals.safe_load_from_bytes`. Pickle names a function by its module
and qualified name, so from then on every tensor that process pickles (every Ray result: logprobs,
metrics, weight-sync handles) names megatron-core, and whichever process unpickles it (the driver,
the SGLang rollout, and any process the driver forwards those tensors to) imports megatron-core
first: seconds of a step spent importing, and a process without megatron-core cannot load them.

`keep_tensor_pickles_portable()` puts megatron's loader back under torch's own name: this process
still loads storages weights-only (megatron's safety measure stays), and what it pickles names
`torch.storage._load_from_bytes`, which every process has.
"""

from __future__ import annotations

import torch.storage

TORCH_NAME = ("torch.storage", "_load_from_bytes")


def keep_tensor_pickles_portable() -> None:
    """Call after megatron-core is imported; a no-op when torch's own loader is in place."""
    current = torch.storage._load_from_bytes
    if (current.__module__, current.__qualname__) == TORCH_NAME:
        return

    def _load_from_bytes(b: bytes):
        return current(b)

    _load_from_bytes.__module__, _load_from_bytes.__qualname__ = TORCH_NAME
    _load_from_bytes.__doc__ = (
        f"{current.__module__}.{current.__qualname__} under torch's name (rlinf pickling.py)"
    )
    torch.storage._load_from_bytes = _load_from_bytes
