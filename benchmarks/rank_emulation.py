"""One rank of a Megatron layout in one process: torch.distributed whose collectives stay on this GPU.

`emulate_rank(world_size, ...)` starts torch.distributed as global rank 0 of `world_size` ranks
and megatron-core's model-parallel groups at the given TP / EP / ETP (SP is the model's setting).
megatron-core then builds exactly what rank 0 of that layout holds (its 2 of 16 heads, its 8 of
64 experts, its vocabulary shard) and runs exactly its GEMMs; only the collectives are stand-ins.

The stand-in (`MirrorGroup`) answers every collective as if each rank of the group held what this
rank holds:

- all-gather: every slot gets this rank's tensor (the sequence-parallel gather before a
  column-parallel GEMM yields T rows from this rank's T/TP);
- reduce-scatter (sum): the group's sum of this rank's chunk, i.e. world x that chunk (the
  row-parallel GEMM's partial sums keep their full-model magnitude); all-reduce: sum = world x,
  max / min / average = itself;
- all-to-all: what rank i sends here is what this rank sends itself, so the MoE dispatcher's
  received rows are world x (this rank's tokens routed to its own experts), consistent with the
  all-gathered token counts the dispatcher sizes its buffers from: with uniform routing, T x top_k
  / EP rows for a T-token micro-batch (docs/moonlight.md, section 6). The way back (the combine)
  returns as many rows as this rank sent to each rank, filled from the rows its experts computed;
- broadcast, scatter (from this rank: its own chunk), barrier: local, no wait.

Each is one or two local copy / scale kernels on the tensors' device (counted in the profile's
kernels and busy time): the real collectives' NVLink time is not in the measurement;
benchmarks/rank_prediction.py adds an estimate of it.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

BACKEND = "rank_emulation"
# Provider settings of the emulated actor: megatron-core's random init instead of a checkpoint
# (`random_weights`), and each token's top-k experts drawn uniformly (random logits with a
# straight-through gradient: the router GEMM still runs forward and backward), so that a rank's
# experts receive T x top_k / EP rows on average whatever the random weights would route.
EMULATION_SETTINGS = {"perform_initialization": True, "moe_router_force_load_balancing": True}


def _done(result=None):
    future: Future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


class MirrorGroup(dist.ProcessGroup):
    """A process group whose other ranks mirror this one (module docstring)."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self._rank, self._world = rank, world_size

    def getBackendName(self) -> str:
        return BACKEND

    # --- gathers --------------------------------------------------------------------------------

    def allgather(self, output_lists, inputs, opts=None):
        for outputs, tensor in zip(output_lists, inputs, strict=True):
            for out in outputs:
                out.copy_(tensor)
        return _done(output_lists)

    def all_gather_single(self, output, tensor, opts=None):
        output.view(self._world, *tensor.shape).copy_(tensor.unsqueeze(0).expand(self._world, *tensor.shape))
        return _done(output)

    _allgather_base = all_gather_single  # torch < 2.13 names

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for out, tensor in zip(outputs, inputs, strict=True):
            self.all_gather_single(out, tensor)
        return _done(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # --- reductions -----------------------------------------------------------------------------

    def _reduce(self, out: torch.Tensor, tensor: torch.Tensor, op) -> None:
        kind = getattr(op, "op", op)  # a ReduceOp wraps its RedOpType, which alone compares in `in`
        if kind in (dist.ReduceOp.SUM, dist.ReduceOp.PREMUL_SUM):
            torch.mul(tensor, self._world, out=out)
        elif out.data_ptr() != tensor.data_ptr():  # max, min, avg, product of ones: itself
            out.copy_(tensor)

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        for tensor in tensors:
            self._reduce(tensor, tensor, op)
        return _done(tensors)

    allreduce_coalesced = allreduce

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        for out, chunks in zip(outputs, input_lists, strict=True):
            self._reduce(out, chunks[self._rank], op)
        return _done(outputs)

    def reduce_scatter_single(self, output, tensor, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        self._reduce(output, tensor.chunk(self._world)[self._rank], op)
        return _done(output)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for out, tensor in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(out, tensor, opts)
        return _done(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # --- all-to-all -----------------------------------------------------------------------------

    def all_to_all_single(self, output, tensor, output_splits, input_splits, opts=None):
        sent_here = _split(tensor, input_splits, self._world)[self._rank]
        for chunk in _split(output, output_splits, self._world):
            if chunk.shape == sent_here.shape:
                chunk.copy_(sent_here)
            else:  # the way back (MoE combine): the sizes this rank sent out, from the rows it holds
                _fill_cyclically(chunk, tensor)
        return _done(output)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        for out in outputs:
            out.copy_(inputs[self._rank])
        return _done(outputs)

    # --- the rest -------------------------------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        return _done(tensors)

    def scatter(self, outputs, input_lists, opts=None):
        for out, chunks in zip(outputs, input_lists or [[]] * len(outputs), strict=True):
            if chunks:
                out.copy_(chunks[self._rank])
        return _done(outputs)

    def barrier(self, opts=None):
        return _done()


def _split(tensor: torch.Tensor, sizes, world: int) -> list[torch.Tensor]:
    sizes = list(sizes) if sizes is not None and len(sizes) else [tensor.shape[0] // world] * world
    return list(torch.split(tensor, [int(s) for s in sizes]))


def _fill_cyclically(chunk: torch.Tensor, rows: torch.Tensor) -> None:
    if len(rows) == 0:
        chunk.zero_()
    else:
        chunk.copy_(rows[torch.arange(len(chunk), device=rows.device) % len(rows)])


def _create_mirror_group(store, rank: int, world_size: int, timeout) -> MirrorGroup:
    return MirrorGroup(rank, world_size)


def random_weights() -> contextlib.AbstractContextManager:
    """Megatron actors built inside skip the HF weight load (their checkpoint folder needs only
    config.json); with EMULATION_SETTINGS megatron-core initialises the weights."""
    import rlinf.models.megatron.bridge as bridge

    return mock.patch.object(bridge, "load_hf_weights_strictly", lambda _bridge, models: models)


def emulate_rank(world_size: int, *, tp: int, ep: int, etp: int = 1) -> None:
    """torch.distributed as rank 0 of `world_size` mirrored ranks, and megatron-core's groups at
    TP / EP / ETP (PP = CP = 1). Data parallelism must be 1 (world = TP = EP x ETP): megatron-core's
    data-parallel gloo groups are real gloo groups, which would wait for the absent ranks."""
    from rlinf.models.megatron import te_placeholder

    te_placeholder.install()  # before megatron-core is first imported (a no-op where TE is real)
    from megatron.core import parallel_state

    if not world_size == tp == ep * etp:
        raise ValueError(
            f"rank emulation needs data parallelism 1: world {world_size} = TP {tp} = EP {ep} x ETP {etp}"
        )

    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create_mirror_group, devices=["cpu", "cuda"])
    dist.init_process_group(BACKEND, store=dist.HashStore(), rank=0, world_size=world_size)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
    )


def end_emulation() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
