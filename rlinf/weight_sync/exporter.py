"""Actor side of the GPU weight syncs: one `WeightExporter` per actor process.

A sync streams: the driver asks every actor rank for the next bucket, each rank gathers and packs it
into one GPU buffer, the engines take it (CUDA IPC handle, or NCCL broadcast from rank 0), and only
then does the next request drop it. A rank therefore holds at most two buckets' bytes: the one
handed over, and the first tensor of the next (`pack_buckets`). Megatron's export is collective, so
every rank is called for every verb and advances bucket by bucket in lockstep. Dropping a bucket
right after the engines reply is safe although SGLang does not synchronise before replying: torch
keeps a buffer shared by CUDA IPC out of its allocator until the consumer has released it, and the
consumer synchronises its stream before releasing (ipc_collect then frees it). The exporter also
keeps the NCCL weight-update group between syncs. An actor exposes it through one method,
`weight_export(verb, *args)`, so the verbs below are the whole interface.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta

import torch

from rlinf.weight_sync.plan import BucketMeta, gpu_uuid, pack_buckets, unflatten_bucket

# A fresh pass over the HF-named weights (a Megatron export's are gathered GPU copies, made one by one).
TensorSource = Callable[[], Iterable[tuple[str, torch.Tensor]]]


class WeightExporter:
    def __init__(self, tensors: TensorSource) -> None:
        self._tensors = tensors
        self._stream: Iterator[tuple[torch.Tensor, BucketMeta]] | None = None
        self._bucket: tuple[torch.Tensor, BucketMeta] | None = None  # the one engines are taking
        self._group = None

    # -- every strategy -------------------------------------------------------------------------
    def begin(self, bucket_bytes: int) -> None:
        """Start this sync's pass over the weights; nothing is gathered yet."""
        self.end()
        self._stream = pack_buckets(self._tensors(), bucket_bytes)

    def next_bucket(self) -> BucketMeta | None:
        """Drop the bucket the engines have taken, gather and pack the next one; its layout, or None
        once every weight has been sent."""
        if self._stream is None:
            raise RuntimeError("weight sync: next_bucket before begin")
        self._drop_bucket()
        self._bucket = next(self._stream, None)
        return None if self._bucket is None else self._bucket[1]

    def end(self) -> None:
        """Stop the pass and free the last bucket (every engine has loaded and flushed)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._drop_bucket()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _drop_bucket(self) -> None:
        self._bucket = None
        if torch.cuda.is_available():
            # A buffer an engine opened by IPC waits in torch's IPC limbo after we drop it, until
            # ipc_collect() sees the engine has released it; only then can the allocator reuse it.
            torch.cuda.ipc_collect()

    def _current(self) -> tuple[torch.Tensor, BucketMeta]:
        if self._bucket is None:
            raise RuntimeError("weight sync: no bucket in hand (next_bucket first)")
        return self._bucket

    # -- CUDA IPC (colocated SGLang) ----------------------------------------------------------
    @staticmethod
    def gpu_uuid() -> str:
        """The UUID of this rank's GPU: the driver pairs each engine TP rank with the actor rank on
        its GPU."""
        return gpu_uuid(torch.cuda.current_device())

    def ipc_handle(self) -> bytes:
        """The current bucket as SGLang's flattened_bucket payload: the bytes hold a CUDA IPC
        handle of this rank's buffer (GPU named by UUID), not the data."""
        flat, meta = self._current()
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

        monkey_patch_torch_reductions()
        metadata = [
            FlattenedTensorMetadata(
                name=t.name,
                shape=torch.Size(t.shape),
                dtype=getattr(torch, t.dtype),
                start_idx=t.start,
                end_idx=t.start + t.nbytes,
                numel=t.nbytes,
            )
            for t in meta.tensors
        ]
        return MultiprocessingSerializer.serialize({"flattened_tensor": flat, "metadata": metadata})

    # -- NCCL (disaggregated SGLang) ----------------------------------------------------------
    @staticmethod
    def address() -> tuple[str, int]:
        """This node's IP and a free port: where the weight-update group meets."""
        host = socket.gethostbyname(socket.gethostname())
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return host, int(s.getsockname()[1])

    def join_group(
        self, host: str, port: int, world_size: int, group_name: str, timeout_s: float = 600
    ) -> None:
        """Join as rank 0; returns once every engine rank has joined (they call
        init_weights_update_group at the same time)."""
        from rlinf.weight_sync.nccl_group import new_nccl_group

        self._group = new_nccl_group(host, port, world_size, 0, group_name, timedelta(seconds=timeout_s))

    def broadcast(self) -> None:
        """Broadcast the current bucket tensor by tensor, in layout order (what the engines expect)."""
        if self._group is None:
            raise RuntimeError("weight sync: broadcast before join_group")
        for _, tensor in unflatten_bucket(*self._current()):
            torch.distributed.broadcast(tensor, src=0, group=self._group)
        torch.cuda.synchronize()

    def leave_group(self) -> None:
        if self._group is not None:
            torch.distributed.destroy_process_group(self._group)
            self._group = None


def dispatch(exporter: WeightExporter, verb: str, *args):
    """The actor's `weight_export(verb, *args)`: only the verbs above are reachable."""
    if verb not in VERBS:
        raise ValueError(f"unknown weight export verb {verb!r} (known: {', '.join(VERBS)})")
    return getattr(exporter, verb)(*args)


VERBS = (
    "begin", "next_bucket", "end", "gpu_uuid", "ipc_handle", "address", "join_group", "broadcast", "leave_group",
)  # fmt: skip
