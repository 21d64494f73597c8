"""Actor -> rollout weight transfer, one strategy per placement (rlinf/weight_sync/plan.py):

- object store (embedded backends): the actor's CPU buckets travel through Ray's object store;
  the rollout fetches them from the actor's node, never through the driver.
- CUDA IPC (colocated SGLang): bucket by bucket, every actor rank packs the bucket into one GPU
  buffer and sends its IPC handle, which goes to the engine TP rank on the same GPU (paired by GPU
  UUID); the engines load it (`update_weights_from_tensor`,
  flattened_bucket), and only then do the actor ranks drop it and pack the next. Released engine
  weights are resumed first; the KV cache comes back only after the actor has offloaded (the
  runner's order, rlinf/runners/colocation.py).
- NCCL (disaggregated SGLang): a weight-update group (actor rank 0 + every engine GPU) is built once,
  then each bucket is broadcast while the engines receive it (`update_weights_from_distributed`).

The runner times the whole call as time/weight_sync. The driver only sends small messages (bucket
layouts, IPC handles); tensors never pass through it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from rlinf.weight_sync.plan import (
    CUDA_IPC,
    NCCL,
    OBJECT_STORE,
    WEIGHT_GROUP_NAME,
    BucketMeta,
    choose_strategy,
    ipc_pairing,
    nccl_group_plan,
)

MIB = 1024 * 1024
# Per rollout group: the chosen strategy (asked once) and whether its NCCL group exists.
_chosen: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_nccl_ready: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_pairing: weakref.WeakKeyDictionary[Any, list[list[int]]] = weakref.WeakKeyDictionary()  # CUDA IPC


def sync_weights(roles, bucket_mb: int) -> str:
    """Push the actor's current weights into every rollout engine; returns the strategy used."""
    strategy = strategy_for(roles)
    SYNCS[strategy](roles, bucket_mb * MIB)
    return strategy


def staged_sync(roles, bucket_mb: int) -> tuple[Callable[[], object], bool]:
    """The actor's weights as they are now, for a rollout that may be busy generating
    (runner.max_staleness >= 1): (load, snapshot). Object store: the export is queued on the actor
    at once, right behind the update, so it holds exactly this version whatever the actor does next;
    `load` hands it to the engines whenever they are between requests (snapshot: True). CUDA IPC and
    NCCL stream from the live actor: `load` is the whole sync, to run while neither side is working
    (snapshot: False)."""
    strategy = strategy_for(roles)
    bucket_bytes = bucket_mb * MIB
    if strategy == OBJECT_STORE:
        exported = roles.actor.call_async("export_weights", bucket_bytes)[0]
        return (lambda: roles.rollout.call("update_weights", exported)), True
    return (lambda: SYNCS[strategy](roles, bucket_bytes)), False


def strategy_for(roles) -> str:
    rollout = roles.rollout
    if rollout not in _chosen:
        info = rollout.call_rank0("weight_sync_info")
        _chosen[rollout] = choose_strategy(info["methods"], roles.colocated)
    return _chosen[rollout]


def sync_object_store(roles, bucket_bytes: int) -> None:
    buckets_ref = roles.actor.call_async("export_weights", bucket_bytes)[0]
    # An ObjectRef passed as an argument is resolved by Ray inside the rollout worker.
    roles.rollout.call("update_weights", buckets_ref)


def sync_cuda_ipc(roles, bucket_bytes: int) -> None:
    actor, rollout = roles.actor, roles.rollout
    pairing = ipc_pairing_for(roles)
    rollout.call("wake", ["weights"])  # a released engine gets empty weight memory back, filled below
    actor.call("weight_export", "begin", bucket_bytes)
    try:
        while next_bucket(actor) is not None:
            handles = actor.call("weight_export", "ipc_handle")  # one per actor rank, on its GPU
            # returns once every engine has loaded the bucket
            rollout.get(
                [
                    engine.execute.remote("update_weights_ipc", [handles[rank] for rank in ranks])
                    for engine, ranks in zip(rollout.handles, pairing, strict=True)
                ]
            )
        rollout.call("flush_cache")
    finally:
        actor.call("weight_export", "end")


def ipc_pairing_for(roles) -> list[list[int]]:
    """Per engine, per TP rank: the actor rank on the same GPU (asked once per rollout group)."""
    rollout = roles.rollout
    if rollout not in _pairing:
        actor_gpus = roles.actor.call("weight_export", "gpu_uuid")
        engine_gpus = [info["gpu_uuids"] for info in rollout.call("weight_sync_info")]
        _pairing[rollout] = ipc_pairing(actor_gpus, engine_gpus)
    return _pairing[rollout]


def sync_nccl(roles, bucket_bytes: int) -> None:
    actor, rollout = roles.actor, roles.rollout
    if not _nccl_ready.get(rollout):
        join_nccl_group(roles)
        _nccl_ready[rollout] = True
    actor.call("weight_export", "begin", bucket_bytes)
    try:
        while (layout := next_bucket(actor)) is not None:
            receiving = rollout.call_async("update_weights_nccl", layout.names, layout.dtypes, layout.shapes)
            # Only actor rank 0 is in the weight-update group; the others wait for the next bucket.
            actor.get([actor.handles[0].execute.remote("weight_export", "broadcast")])
            rollout.get(receiving)
        rollout.call("flush_cache")
    finally:
        actor.call("weight_export", "end")


def next_bucket(actor) -> BucketMeta | None:
    """Every actor rank drops the bucket the engines have taken and packs the next (a sharded export
    is collective: all ranks advance together); its layout, None at the end."""
    layouts = actor.call("weight_export", "next_bucket")
    if any(layout != layouts[0] for layout in layouts):
        sizes = [None if layout is None else len(layout.tensors) for layout in layouts]
        raise RuntimeError(
            f"weight sync: the actor ranks packed different buckets (tensors per rank: {sizes})"
        )
    return layouts[0]


def join_nccl_group(roles) -> None:
    """Engines and actor rank 0 join one group at the same time (each side blocks until all have)."""
    actor, rollout = roles.actor, roles.rollout
    tp_size = rollout.call_rank0("weight_sync_info")["tp_size"]
    plan = nccl_group_plan(len(rollout), tp_size)
    host, port = actor.call_rank0("weight_export", "address")
    engines = [
        handle.execute.remote("init_weight_group", host, port, offset, plan.world_size, WEIGHT_GROUP_NAME)
        for handle, offset in zip(rollout.handles, plan.rank_offsets, strict=True)
    ]
    trainer = actor.handles[0].execute.remote(
        "weight_export", "join_group", host, port, plan.world_size, WEIGHT_GROUP_NAME
    )
    rollout.get(engines)
    actor.get([trainer])


SYNCS = {OBJECT_STORE: sync_object_store, CUDA_IPC: sync_cuda_ipc, NCCL: sync_nccl}
