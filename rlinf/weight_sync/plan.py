"""Pure pieces of a weight sync: which strategy a placement uses, bucket metadata, packing tensors
into flattened buckets, and the NCCL group's ranks. No Ray, no sglang: tested on the CPU."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

OBJECT_STORE = "object_store"  # embedded backends: CPU buckets through Ray's object store
CUDA_IPC = "cuda_ipc"  # colocated SGLang: the actor's GPU buckets shared by CUDA IPC handles
NCCL = "nccl"  # disaggregated SGLang: the actor broadcasts each bucket to the engines
STRATEGIES = (OBJECT_STORE, CUDA_IPC, NCCL)
WEIGHT_GROUP_NAME = "rlinf_weight_sync"


def choose_strategy(rollout_takes: Sequence[str], colocated: bool) -> str:
    """The strategy for a placement: what the rollout accepts (its `weight_sync_methods`), and
    whether it shares GPUs with the actor (IPC needs the same GPUs, NCCL needs different ones)."""
    preferred = CUDA_IPC if colocated else NCCL
    if preferred in rollout_takes:
        return preferred
    if OBJECT_STORE in rollout_takes:
        return OBJECT_STORE
    raise ValueError(f"the rollout accepts weights only by {list(rollout_takes)}; none fits this placement")


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16" (what SGLang's API takes)
    shape: tuple[int, ...]
    start: int  # byte offset in the flattened bucket
    nbytes: int


@dataclass(frozen=True)
class BucketMeta:
    tensors: tuple[TensorMeta, ...]

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    @property
    def dtypes(self) -> list[str]:
        return [t.dtype for t in self.tensors]

    @property
    def shapes(self) -> list[list[int]]:
        return [list(t.shape) for t in self.tensors]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


ALIGN_BYTES = 16  # each tensor starts at a multiple: its bytes can be viewed as any dtype (<= 8 bytes)


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN_BYTES) * ALIGN_BYTES


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def pack_buckets(
    tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[tuple[torch.Tensor, BucketMeta]]:
    """Consecutive buckets of `tensors`, each packed into one uint8 buffer (mixed dtypes) as its
    tensors arrive, with its layout. Copies: the model may change afterwards without touching them.

    Memory: a source tensor is dropped as soon as it is copied, so a bucket costs its buffer
    (`bucket_bytes`, or one tensor that is larger) plus the source tensor in hand. A bucket is
    complete when the next tensor does not fit, so while the consumer holds bucket i the first tensor
    of bucket i+1 is alive too: at most two buckets' bytes, provided the consumer drops bucket i
    before asking for the next one.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buffer: torch.Tensor | None = None
    metas: list[TensorMeta] = []
    used = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        start = _aligned(used)
        if buffer is not None and start + nbytes > buffer.numel():
            bucket = buffer[:used], BucketMeta(tuple(metas))
            buffer, metas, start = None, [], 0
            yield bucket
            del bucket  # this frame must not keep a bucket the consumer has dropped
        if buffer is None:
            buffer = torch.empty(max(bucket_bytes, nbytes), dtype=torch.uint8, device=tensor.device)
        buffer[start : start + nbytes].copy_(_bytes_of(tensor))
        metas.append(TensorMeta(name, dtype_name(tensor.dtype), tuple(tensor.shape), start, nbytes))
        used = start + nbytes
        del tensor  # a gathered copy goes now, not when the source has gathered the next one
    if buffer is not None:
        yield buffer[:used], BucketMeta(tuple(metas))


def unflatten_bucket(flat: torch.Tensor, meta: BucketMeta) -> list[tuple[str, torch.Tensor]]:
    """Views of `flat` under the bucket's names, dtypes and shapes (the inverse of pack_buckets)."""
    return [
        (t.name, flat[t.start : t.start + t.nbytes].view(getattr(torch, t.dtype)).reshape(t.shape))
        for t in meta.tensors
    ]


@dataclass(frozen=True)
class NcclGroupPlan:
    """The weight-update group: the actor's exporting rank is rank 0, engine k's TP rank j is
    1 + k * tp_size + j (SGLang computes rank_offset + tp_rank itself)."""

    world_size: int
    rank_offsets: tuple[int, ...]  # one per engine


def nccl_group_plan(num_engines: int, tp_size: int) -> NcclGroupPlan:
    if num_engines < 1 or tp_size < 1:
        raise ValueError(f"need >= 1 engine of >= 1 GPU, got {num_engines} x {tp_size}")
    return NcclGroupPlan(
        world_size=1 + num_engines * tp_size,
        rank_offsets=tuple(1 + k * tp_size for k in range(num_engines)),
    )


def gpu_uuid(device: int) -> str:
    """A visible GPU's UUID as nvidia-smi prints it (GPU-...). Reads the device properties, which
    creates no CUDA context."""
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"


def _same_gpu(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def ipc_pairing(actor_gpus: Sequence[str], engine_gpus: Sequence[Sequence[str]]) -> list[list[int]]:
    """For each engine, per TP rank, the actor rank whose IPC handle it opens: the one on its own GPU
    (a sharded actor has a copy of each bucket on every GPU), matched by GPU UUID, since nothing
    makes the two groups' rank orders agree. A single actor rank serves every TP rank (another GPU's
    handle opens as peer memory)."""
    if len(actor_gpus) == 1:
        return [[0] * len(gpus) for gpus in engine_gpus]
    rank_on: dict[str, int] = {}
    for rank, uuid in enumerate(actor_gpus):
        rank_on.setdefault(_same_gpu(uuid), rank)
    pairing = []
    for engine, gpus in enumerate(engine_gpus):
        for tp_rank, uuid in enumerate(gpus):
            if _same_gpu(uuid) not in rank_on:
                raise ValueError(
                    f"CUDA IPC weight sync: engine {engine}'s TP rank {tp_rank} is on GPU {uuid}, where no "
                    f"actor rank runs (the actor ranks' GPUs: {', '.join(actor_gpus)}); colocated weight "
                    "sync needs an actor rank on every engine GPU"
                )
        pairing.append([rank_on[_same_gpu(uuid)] for uuid in gpus])
    return pairing
