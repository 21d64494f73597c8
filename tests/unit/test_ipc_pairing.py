"""CUDA IPC weight sync: an engine's TP rank opens the IPC handle of the actor rank on its own GPU,
matched by GPU UUID, whatever the two groups' rank orders are. The driver runs for real; each engine
is the real SGLangRollout.update_weights_ipc over a recording engine."""

from types import SimpleNamespace

import pytest
from weight_sync_fakes import FakeGroup

import rlinf.weight_sync as ws
from rlinf.weight_sync.plan import CUDA_IPC, NCCL, OBJECT_STORE, ipc_pairing
from rlinf.workers.rollout.sglang_rollout import SGLangRollout

# Four GPUs; Ray placed the actor ranks in an order that is not the engines' GPU order.
ACTOR_GPUS = ["GPU-c", "GPU-a", "GPU-d", "GPU-b"]
ENGINE_GPUS = [["GPU-a", "GPU-b"], ["GPU-c", "GPU-d"]]  # two engines of TP=2


def test_each_engine_tp_rank_gets_the_actor_rank_on_its_gpu():
    assert ipc_pairing(ACTOR_GPUS, ENGINE_GPUS) == [[1, 3], [0, 2]]
    # torch reports a UUID without the "GPU-" prefix that nvidia-smi and NVML print
    assert ipc_pairing(["c", "A", "d", "b"], ENGINE_GPUS) == [[1, 3], [0, 2]]


def test_one_actor_rank_serves_every_tp_rank():
    assert ipc_pairing(["GPU-a"], ENGINE_GPUS) == [[0, 0], [0, 0]]


def test_an_engine_gpu_without_an_actor_rank_is_refused_by_name():
    with pytest.raises(ValueError, match=r"engine 1's TP rank 1 is on GPU GPU-e, where no actor rank runs"):
        ipc_pairing(ACTOR_GPUS, [["GPU-a", "GPU-b"], ["GPU-c", "GPU-e"]])


class Loads:
    def __init__(self) -> None:
        self.loaded: list = []

    def load_tensors(self, payloads, *, flattened=False):
        self.loaded.append((list(payloads), flattened))


def test_a_sync_hands_each_engine_the_handles_made_on_its_gpus():
    log: list = []
    engines = [Loads() for _ in ENGINE_GPUS]
    packed: dict = {}  # per actor rank: one bucket, then the end

    def actor_answer(rank, method, args):
        verb = args[0]
        if verb == "begin":
            packed[rank] = iter(["layout", None])
        return {
            "gpu_uuid": ACTOR_GPUS[rank],
            "next_bucket": next(packed[rank]) if verb == "next_bucket" else None,
            "ipc_handle": f"handle on {ACTOR_GPUS[rank]}",
        }.get(verb)

    def rollout_answer(rank, method, args):
        if method == "weight_sync_info":
            return {"methods": (CUDA_IPC, NCCL, OBJECT_STORE), "tp_size": 2, "gpu_uuids": ENGINE_GPUS[rank]}
        if method == "update_weights_ipc":
            worker = SimpleNamespace(rank=rank, tp_size=2, engine=engines[rank], where=f"engine {rank}")
            return SGLangRollout.update_weights_ipc(worker, *args)  # type: ignore[arg-type]
        return None

    roles = SimpleNamespace(
        colocated=True,
        actor=FakeGroup("actor", len(ACTOR_GPUS), log, actor_answer),
        rollout=FakeGroup("rollout", len(ENGINE_GPUS), log, rollout_answer),
    )
    assert ws.sync_weights(roles, bucket_mb=1) == CUDA_IPC
    for engine, gpus in zip(engines, ENGINE_GPUS, strict=True):
        assert engine.loaded == [([f"handle on {gpu}" for gpu in gpus], True)]
