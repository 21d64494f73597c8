"""Small real workers for the many-rank tests (imported inside Ray workers by dotted path)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from rlinf.scheduler.worker_group import DIST_ENV_VARS


class CollectiveWorker:
    def __init__(self, *, rank: int, world_size: int) -> None:
        self.rank = rank

    def environment(self) -> dict[str, str]:
        return {name: os.environ[name] for name in DIST_ENV_VARS} | {"backend": dist.get_backend()}

    def all_reduce_rank_plus_one(self) -> float:
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return float(value)

    def die_on_rank(self, dying: int, peers: str) -> float:
        """Rank `dying` exits hard. The others block in an all_reduce that can never complete
        (gloo notices the lost peer and errors) or, like NCCL, hang without noticing."""
        if self.rank == dying:
            os._exit(1)
        if peers == "hang":
            time.sleep(120)
        return self.all_reduce_rank_plus_one()

    def raise_on_rank(self, failing: int) -> int:
        if self.rank == failing:
            raise ValueError(f"rank {self.rank} refuses")
        return self.rank


class SelfInitWorker(CollectiveWorker):
    """A backend that joins the process group itself, as the Megatron actor does."""

    INITS_PROCESS_GROUP = True

    def __init__(self, *, rank: int, world_size: int) -> None:
        assert not dist.is_initialized(), "the group must leave the init to this backend"
        dist.init_process_group(backend="gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        super().__init__(rank=rank, world_size=world_size)
