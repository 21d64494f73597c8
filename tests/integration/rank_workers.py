"""Small real workers for the many-rank tests (imported inside Ray workers by dotted path)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from rlinf.scheduler.worker_group import DIST_ENV_VARS
from rlinf.workers.actor.torch_actor import TorchActor
from rlinf.workers.rollout.torch_rollout import TorchRollout


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


# --- real embedded workers that also journal their memory-phase verbs (colocated order test) ---

JOURNAL = "verb_journal.txt"


def _journal(cfg, verb: str) -> None:
    # One file under the run's output dir, shared by both workers; a monotonic stamp orders them.
    path = Path(cfg.runner.output_dir) / JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(f"{time.monotonic_ns()} {verb}\n")


def read_journal(output_dir: str) -> list[str]:
    lines = (Path(output_dir) / JOURNAL).read_text().splitlines()
    return [verb for _, verb in sorted(line.split(" ", 1) for line in lines)]


class JournalingTorchActor(TorchActor):
    def onload(self) -> None:
        _journal(self.cfg, "actor.onload")
        super().onload()

    def offload(self) -> dict[str, float]:
        _journal(self.cfg, "actor.offload")
        return super().offload()

    def compute_logprobs(self, batch):
        _journal(self.cfg, "actor.compute_logprobs")
        return super().compute_logprobs(batch)

    def train(self, batch, step, logprobs=None):
        _journal(self.cfg, "actor.train")
        return super().train(batch, step, logprobs)

    def export_weights(self, bucket_bytes):
        _journal(self.cfg, "actor.export_weights")
        return super().export_weights(bucket_bytes)


class JournalingTorchRollout(TorchRollout):
    def generate(self, prompts, n, params, seed):
        _journal(self.cfg, "rollout.generate")
        return super().generate(prompts, n, params, seed)

    def sleep(self, tags=None) -> None:
        _journal(self.cfg, "rollout.sleep" if tags is None else f"rollout.sleep:{','.join(tags)}")
        super().sleep(tags)

    def wake(self, tags=None) -> None:
        _journal(self.cfg, f"rollout.wake:{','.join(tags or ['all'])}")
        super().wake(tags)

    def update_weights(self, buckets) -> None:
        _journal(self.cfg, "rollout.update_weights")
        super().update_weights(buckets)

    def close(self) -> None:
        _journal(self.cfg, "rollout.close")
        super().close()


class BusyWorker:
    """Stands in for any role at shutdown: `busy` keeps the worker's only thread occupied."""

    def __init__(self, *, rank: int = 0, world_size: int = 1) -> None:
        self.closed = False

    def busy(self, seconds: float) -> None:
        time.sleep(seconds)

    def close(self) -> None:
        self.closed = True
