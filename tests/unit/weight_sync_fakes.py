"""Fakes for weight-sync tests on the CPU: a recording WorkerGroup, sglang's serializer pieces (the
payload keeps the flattened bytes, not an IPC handle), and a count of the tensor memory alive."""

from __future__ import annotations

import pickle
import sys
import types
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class _Ref:
    def __init__(self, value, rank=0, method=""):
        self.value, self.rank, self.method = value, rank, method


class _Handle:
    def __init__(self, group, rank):
        self.group, self.rank = group, rank
        self.execute = self

    def remote(self, method, *args):
        return _Ref(self.group.record(self.rank, method, args), self.rank, method)


class FakeGroup:
    """A WorkerGroup stand-in: records (role, rank, method, args) in a shared log; `answer(rank,
    method, args)` gives each call's result."""

    def __init__(self, role, num, log, answer):
        self.role, self.log, self.answer = role, log, answer
        self.handles = [_Handle(self, r) for r in range(num)]

    def __len__(self):
        return len(self.handles)

    def record(self, rank, method, args):
        self.log.append((self.role, rank, method, args))
        return self.answer(rank, method, args)

    def call_async(self, method, *args):
        return [h.execute.remote(method, *args) for h in self.handles]

    def call(self, method, *args):
        return self.get(self.call_async(method, *args))

    def call_rank0(self, method, *args):
        return self.get([self.handles[0].execute.remote(method, *args)])[0]

    def get(self, refs):
        self.log.extend((self.role, r.rank, f"wait:{r.method}", ()) for r in refs)
        return [r.value for r in refs]


@dataclass(frozen=True)
class FlattenedTensorMetadata:  # sglang.srt.weight_sync.tensor_bucket's fields
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


def serialize(payload) -> bytes:
    """What the engine would read through the handle: the bucket's bytes (a copy outside torch's
    allocator: the engine's memory, not the actor's) and its layout."""
    flat = payload["flattened_tensor"]
    return pickle.dumps((flat.numpy().tobytes(), payload["metadata"]))


def received_tensors(payload: bytes) -> dict[str, torch.Tensor]:
    data, metadata = pickle.loads(payload)
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return {m.name: flat[m.start_idx : m.end_idx].view(m.dtype).reshape(m.shape).clone() for m in metadata}


def install_fake_sglang(monkeypatch) -> None:
    modules = {
        "sglang": {},
        "sglang.srt": {},
        "sglang.srt.utils": {"MultiprocessingSerializer": types.SimpleNamespace(serialize=serialize)},
        "sglang.srt.utils.patch_torch": {"monkey_patch_torch_reductions": lambda: None},
        "sglang.srt.weight_sync": {},
        "sglang.srt.weight_sync.tensor_bucket": {"FlattenedTensorMetadata": FlattenedTensorMetadata},
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the tensor storages created while active (by any torch op, per `owner`) that are
    still alive, and the peak per owner. Views and in-place results are not new storage."""

    def __init__(self) -> None:
        super().__init__()
        self.owner = None
        self.live: dict = {}
        self.peak: dict = {}
        self._tracked: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in inputs:
                self._track(tensor.untyped_storage())
        return out

    def _track(self, storage) -> None:
        key, nbytes, owner = id(storage), storage.nbytes(), self.owner
        if key in self._tracked:
            return
        self._tracked.add(key)
        self.live[owner] = self.live.get(owner, 0) + nbytes
        self.peak[owner] = max(self.peak.get(owner, 0), self.live[owner])
        weakref.finalize(storage, self._free, key, nbytes, owner)

    def _free(self, key: int, nbytes: int, owner) -> None:
        self._tracked.discard(key)
        self.live[owner] -= nbytes
