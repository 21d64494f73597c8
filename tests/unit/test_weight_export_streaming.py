"""A whole colocated (CUDA IPC) weight sync through the real driver and real WeightExporters, one per
actor rank, on the CPU: each rank's export memory stays within two buckets, everything it allocated is
freed by the end, and the engine receives every weight. The weights come from a source that makes a
fresh tensor per weight, as Megatron-Bridge's export gathers one; sglang's serializer is a fake that
copies the bucket's bytes out (what the engine would read through the handle)."""

import torch
from weight_sync_fakes import FakeGroup, LiveTensorBytes, install_fake_sglang, received_tensors

import rlinf.weight_sync as ws
from rlinf.weight_sync.exporter import WeightExporter, dispatch
from rlinf.weight_sync.plan import CUDA_IPC, NCCL, OBJECT_STORE

MIB = 1024 * 1024
ACTOR_RANKS = TP = 2


def weight_value(i: int) -> float:
    return float(i % 50)  # exact in bf16


def gathered_weights():
    """24 tensors of 96 to 257 KiB, mixed dtypes (about 4 MiB): each made when it is reached."""
    for i in range(24):
        dtype = torch.bfloat16 if i % 3 else torch.float32
        numel = (96 + 7 * i) * 1024 // dtype.itemsize
        yield f"model.layers.{i}.weight", torch.full((numel,), weight_value(i), dtype=dtype)


class Roles:
    def __init__(self, live: LiveTensorBytes) -> None:
        self.colocated = True
        self.log: list = []
        self.payloads: list[list[bytes]] = []
        exporters = [WeightExporter(gathered_weights) for _ in range(ACTOR_RANKS)]

        def actor_answer(rank, method, args):
            if args[0] == "gpu_uuid":
                return f"GPU-{rank}"  # no CUDA here: rank r sits on the engine's TP rank r's GPU
            live.owner = rank  # what this call allocates is rank `rank`'s
            try:
                return dispatch(exporters[rank], *args)
            finally:
                live.owner = None

        def rollout_answer(rank, method, args):
            if method == "weight_sync_info":
                return {
                    "methods": (CUDA_IPC, NCCL, OBJECT_STORE),
                    "tp_size": TP,
                    "gpu_uuids": [f"GPU-{j}" for j in range(TP)],
                }
            if method == "update_weights_ipc":
                self.payloads.append(list(args[0]))
            return None

        self.actor = FakeGroup("actor", ACTOR_RANKS, self.log, actor_answer)
        self.rollout = FakeGroup("rollout", 1, self.log, rollout_answer)


def test_a_colocated_sync_holds_at_most_two_buckets_per_actor_rank(monkeypatch):
    install_fake_sglang(monkeypatch)
    live = LiveTensorBytes()
    roles = Roles(live)
    bucket_bytes = 1 * MIB
    with live:
        assert ws.sync_weights(roles, bucket_mb=1) == CUDA_IPC
    total = sum(t.numel() * t.element_size() for _, t in gathered_weights())
    assert total > 4 * bucket_bytes  # the whole model would break the bound below
    for rank in range(ACTOR_RANKS):
        assert live.peak[rank] <= 2 * bucket_bytes, f"rank {rank} held {live.peak[rank] / MIB:.2f} MiB"
        assert live.live[rank] == 0  # nothing of the export outlives the sync
    assert len(roles.payloads) >= 4  # several buckets went over, one handle per TP rank each
    for tp_rank in range(TP):
        received = {}
        for handles in roles.payloads:
            received.update(received_tensors(handles[tp_rank]))
        expected = dict(gathered_weights())
        assert received.keys() == expected.keys()
        assert all(torch.equal(received[name], tensor) for name, tensor in expected.items())
