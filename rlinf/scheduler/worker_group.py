"""Worker groups: a role's Ray actors, created from a dotted class path, called together.

A group of N ranks starts in two rounds. First every Ray actor starts empty and rank 0 reports
its node's IP and a free port. Then every rank, concurrently, constructs its backend; in a
`distributed` group (the actor) it first sets the torch.distributed environment (`RANK`,
`WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) and joins one
process group (NCCL when the rank sees a GPU, gloo otherwise). A backend class that initialises the
process group itself (Megatron: `torch.distributed.init_process_group(backend="nccl")` from these
variables, then `initialize_model_parallel`) sets the class attribute `INITS_PROCESS_GROUP = True`;
the environment is set for it all the same.

Ray gives each GPU rank exactly one visible device, so a rank's GPU is always `cuda:0`
(rlinf.workers.common.worker_device); `LOCAL_RANK` is the rank's index among the group's ranks on
its node, not a device index.

Every call waits on all ranks at once (`ray.wait`) and stops at the first failure, naming the role
and rank: a rank that dies while its peers sit in a collective is reported within about a second,
instead of after the peers' collective timeout.
"""

from __future__ import annotations

import importlib
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

# After a rank fails, how long to look for a dead peer that caused it.
DEAD_PEER_GRACE_S = 3.0
DIST_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class WorkerError(RuntimeError):
    """A worker method raised; the message names the role and rank."""


class WorkerDiedError(WorkerError):
    """A worker process died (killed, OOM, crashed)."""


def import_target(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def init_process_group() -> None:
    """Join the process group described by the DIST_ENV_VARS (idempotent).

    NCCL when this process sees a GPU, gloo otherwise. Backends that init it themselves may call
    this instead of torch.distributed.init_process_group.
    """
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )


class WorkerHost:
    """The one Ray actor class: imports the backend only inside the worker process."""

    def __init__(self) -> None:
        self.worker: Any = None

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a port free on it now (rank 0's answer becomes MASTER_ADDR/PORT)."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def start(
        self,
        target: str,
        rank: int,
        world_size: int,
        dist_env: dict[str, str],
        distributed: bool,
        args: tuple,
    ) -> int:
        os.environ.update(dist_env)
        cls = import_target(target)
        if distributed and not getattr(cls, "INITS_PROCESS_GROUP", False):
            init_process_group()
        self.worker = cls(*args, rank=rank, world_size=world_size)
        return os.getpid()

    def execute(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)

    def pid(self) -> int:
        return os.getpid()

    def environment_variable(self, name: str) -> str | None:
        """One variable of this rank's process environment (e.g. one WorkerGroup's `env` set)."""
        return os.environ.get(name)

    def device_memory_used_gib(self) -> float | None:
        """Memory in use on this rank's GPU by ALL processes (an SGLang engine's too); None on CPU."""
        import torch

        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 2**30

    def device_memory_total_gib(self) -> float | None:
        """This rank's GPU memory in all; None on CPU."""
        import torch

        return torch.cuda.mem_get_info()[1] / 2**30 if torch.cuda.is_available() else None

    def empty_device_cache(self) -> None:
        """Hand this process's cached, unused GPU blocks back to the device (for a colocated engine)."""
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class WorkerGroup:
    def __init__(
        self,
        role: str,
        target: str,
        args: Sequence[Any],
        *,
        num_workers: int = 1,
        gpu_share: float = 0.0,
        placement_group: Any = None,
        bundle_indices: Sequence[int] = (),
        distributed: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`distributed`: join the ranks in one torch.distributed process group before construction.
        `env`: variables each rank's process starts with (for libraries that read them only then)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.role = role
        self.target = target
        remote_cls = ray.remote(WorkerHost)
        self.handles = []
        for rank in range(num_workers):
            options: dict[str, Any] = {"num_cpus": 0, "num_gpus": gpu_share, "max_concurrency": 1}
            if env:  # merged with the job's own variables (PYTHONPATH)
                options["runtime_env"] = {"env_vars": dict(env)}
            if placement_group is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=placement_group, placement_group_bundle_index=bundle_indices[rank]
                )
            self.handles.append(remote_cls.options(**options).remote())
        master_addr, master_port = self._get([self.handles[0].rendezvous_address.remote()])[0]
        node_ips = self._get([h.node_ip.remote() for h in self.handles])
        # Constructors run concurrently (a process group forms only when every rank joins) and their
        # failures (bad checkpoint, missing package) surface now, with the role's name.
        self._pids = self._get(
            [
                handle.start.remote(
                    target,
                    rank,
                    num_workers,
                    # Only a distributed group gets the variables: an SGLang engine starts its own
                    # process group and must not see RANK / WORLD_SIZE of the rollout group.
                    _dist_env(rank, node_ips, master_addr, master_port) if distributed else {},
                    distributed,
                    tuple(args),
                )
                for rank, handle in enumerate(self.handles)
            ]
        )

    def __len__(self) -> int:
        return len(self.handles)

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> list:
        return [h.execute.remote(method, *args, **kwargs) for h in self.handles]

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Run `method` on every rank with the same arguments; results in rank order."""
        return self._get(self.call_async(method, *args, **kwargs))

    def call_each(self, method: str, per_rank_args: Sequence[tuple | None]) -> list:
        """Rank i runs `method(*per_rank_args[i])`; None skips that rank (its result is None)."""
        if len(per_rank_args) != len(self.handles):
            raise ValueError(
                f"{self.role}: {len(per_rank_args)} argument tuples for {len(self.handles)} ranks"
            )
        refs = {
            rank: handle.execute.remote(method, *args)
            for rank, (handle, args) in enumerate(zip(self.handles, per_rank_args, strict=True))
            if args is not None
        }
        results = dict(zip(refs, self._get(list(refs.values()), ranks=list(refs)), strict=True))
        return [results.get(rank) for rank in range(len(self.handles))]

    def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._get([self.handles[0].execute.remote(method, *args, **kwargs)])[0]

    def pids(self) -> list[int]:
        return list(self._pids)

    def device_memory_used_gib(self) -> list[float | None]:
        return self._get([h.device_memory_used_gib.remote() for h in self.handles])

    def device_memory_total_gib(self) -> list[float | None]:
        return self._get([h.device_memory_total_gib.remote() for h in self.handles])

    def empty_device_cache(self) -> None:
        self._get([h.empty_device_cache.remote() for h in self.handles])

    def get(self, refs: list) -> list:
        """Results of refs from call_async (in rank order), with this group's failure handling."""
        return self._get(refs)

    def _get(self, refs: list, ranks: Sequence[int] | None = None) -> list:
        """Wait on all refs at once; the first failure (in completion order) raises, naming its rank."""
        import ray

        rank_of = {ref: (ranks[i] if ranks is not None else i) for i, ref in enumerate(refs)}
        results: dict[Any, Any] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                try:
                    results[ref] = self._result(ref, rank_of[ref])
                except WorkerDiedError:
                    raise
                except WorkerError as err:
                    dead = self._dead_peer(pending, rank_of, err)
                    if dead is not None:
                        raise dead from None
                    raise
        return [results[ref] for ref in refs]

    def _dead_peer(self, pending: list, rank_of: dict, err: WorkerError) -> WorkerDiedError | None:
        """A rank whose peer died often fails first (gloo: "connection reset by peer"); name the
        dead rank instead, if one is found within a short grace period."""
        import ray

        if not pending:
            return None
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=DEAD_PEER_GRACE_S)
        for ref in ready:
            try:
                self._result(ref, rank_of[ref])
            except WorkerDiedError as died:
                return WorkerDiedError(f"{died} (and then: {err})")
            except WorkerError:
                continue
        return None

    def _result(self, ref: Any, rank: int) -> Any:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return ray.get(ref)
        except RayActorError as err:
            raise WorkerDiedError(f"{self.role} worker (rank {rank}) died: {_first_line(err)}") from None
        except RayTaskError as err:
            cause = err.cause if getattr(err, "cause", None) is not None else err
            raise WorkerError(
                f"{self.role} worker (rank {rank}) failed: {type(cause).__name__}: {cause}"
            ) from cause

    def kill(self) -> None:
        import ray

        for handle in self.handles:
            ray.kill(handle, no_restart=True)


def _dist_env(rank: int, node_ips: Sequence[str], master_addr: str, master_port: int) -> dict[str, str]:
    same_node = [r for r, ip in enumerate(node_ips) if ip == node_ips[rank]]
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(len(node_ips)),
        "LOCAL_RANK": str(same_node.index(rank)),
        "LOCAL_WORLD_SIZE": str(len(same_node)),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
