"""Actor side of the GPU weight syncs: one `WeightExporter` per actor process.

It holds what must outlive a single Ray call: the bucket plan of this sync, the GPU copies whose
CUDA IPC handles an engine holds (kept until `end()`, i.e. until every engine has loaded them and
flushed), and the NCCL weight-update group. An actor exposes it through one method,
`weight_export(verb, *args)`, so the verbs below are the whole interface.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch

from rlinf.weight_sync.plan import BucketMeta, bucket_meta, flatten_bucket

BucketSource = Callable[[int], Iterator[list[tuple[str, torch.Tensor]]]]


class WeightExporter:
    def __init__(self, buckets: BucketSource) -> None:
        self._buckets = buckets  # bucket_bytes -> iterator of HF-named GPU tensors (views)
        self._plan: list[list[tuple[str, torch.Tensor]]] = []
        self._kept: list[torch.Tensor] = []  # flattened copies engines may still read
        self._payloads: dict[int, bytes] = {}  # serialized IPC payload per bucket index
        self._group = None

    # -- every strategy -------------------------------------------------------------------------
    def begin(self, bucket_bytes: int) -> list[BucketMeta]:
        """Fix this sync's buckets (views of the current weights) and return their layouts."""
        self.end()
        self._plan = list(self._buckets(bucket_bytes))
        return [bucket_meta(b) for b in self._plan]

    def end(self) -> None:
        """Drop the plan and the kept GPU copies (every engine has loaded and flushed)."""
        self._plan, self._kept, self._payloads = [], [], {}
        if torch.cuda.is_available():
            # Buffers an engine opened by IPC wait in torch's IPC limbo after we drop them, until
            # ipc_collect() sees the engine has released them; only then can the cache give them back.
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()

    # -- CUDA IPC (colocated SGLang) ----------------------------------------------------------
    def ipc_handle(self, index: int) -> bytes:
        """Bucket `index` flattened into one GPU buffer, serialized as SGLang's flattened_bucket
        payload: the bytes carry a CUDA IPC handle (GPU named by UUID), not the data."""
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

        monkey_patch_torch_reductions()
        if index in self._payloads:
            return self._payloads[index]
        flat, meta = flatten_bucket(self._plan[index])
        # The flat copy is what engines read; drop the plan's tensors (a Megatron export's are
        # gathered copies, not views), so a sync holds one copy of the weights, not two.
        self._plan[index] = []
        self._kept.append(flat)
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
        self._payloads[index] = MultiprocessingSerializer.serialize(
            {"flattened_tensor": flat, "metadata": metadata}
        )
        return self._payloads[index]

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

    def broadcast(self, index: int) -> None:
        """Broadcast bucket `index` tensor by tensor, in plan order (what the engines expect)."""
        if self._group is None:
            raise RuntimeError("weight sync: broadcast before join_group")
        for _, tensor in self._plan[index]:
            torch.distributed.broadcast(tensor.detach().contiguous(), src=0, group=self._group)
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


VERBS = ("begin", "end", "ipc_handle", "address", "join_group", "broadcast", "leave_group")
