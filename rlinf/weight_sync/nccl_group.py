"""The trainer's end of SGLang's weight-update process group.

SGLang's scheduler joins with `init_custom_process_group(init_method="tcp://host:port",
group_name=...)`: a TCP rendezvous whose store is wrapped in PrefixStore(group_name). Our end must
meet it on the same store keys, as an extra group that leaves the actor's own default group (Megatron's)
untouched, so it is built the same way from torch's group constructor.
"""

from __future__ import annotations

from datetime import timedelta


def new_nccl_group(host: str, port: int, world_size: int, rank: int, group_name: str, timeout: timedelta):
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    store, rank, world_size = next(rendezvous(f"tcp://{host}:{port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend("nccl"),
        PrefixStore(group_name, store),
        group_name=group_name,  # type: ignore[arg-type]  # GroupName is a str NewType
        timeout=timeout,
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group
