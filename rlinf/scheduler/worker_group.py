"""Worker groups: a role's Ray actors, created lazily from a dotted class path, called together."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any


class WorkerError(RuntimeError):
    """A worker method raised; the message names the role and rank."""


class WorkerDiedError(WorkerError):
    """A worker process died (killed, OOM, crashed)."""


def import_target(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class WorkerHost:
    """The one Ray actor class: imports the backend only inside the worker process."""

    def __init__(self, target: str, rank: int, world_size: int, *args: Any) -> None:
        self.worker = import_target(target)(*args, rank=rank, world_size=world_size)

    def execute(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)

    def pid(self) -> int:
        return os.getpid()


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
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.role = role
        remote_cls = ray.remote(WorkerHost)
        self.handles = []
        for rank in range(num_workers):
            options: dict[str, Any] = {"num_cpus": 0, "num_gpus": gpu_share, "max_concurrency": 1}
            if placement_group is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=placement_group, placement_group_bundle_index=bundle_indices[rank]
                )
            handle = remote_cls.options(**options).remote(target, rank, num_workers, *args)
            self.handles.append(handle)
        # Surface constructor failures (bad checkpoint, missing package) now, with the role's name.
        self._get([h.pid.remote() for h in self.handles])

    def __len__(self) -> int:
        return len(self.handles)

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> list:
        return [h.execute.remote(method, *args, **kwargs) for h in self.handles]

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Run `method` on every rank with the same arguments; results in rank order."""
        return self._get(self.call_async(method, *args, **kwargs))

    def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._get([self.handles[0].execute.remote(method, *args, **kwargs)])[0]

    def pids(self) -> list[int]:
        return self._get([h.pid.remote() for h in self.handles])

    def _get(self, refs: list) -> list:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        results = []
        for rank, ref in enumerate(refs):
            try:
                results.append(ray.get(ref))
            except RayActorError as err:
                raise WorkerDiedError(f"{self.role} worker (rank {rank}) died: {_first_line(err)}") from None
            except RayTaskError as err:
                cause = err.cause if getattr(err, "cause", None) is not None else err
                raise WorkerError(
                    f"{self.role} worker (rank {rank}) failed: {type(cause).__name__}: {cause}"
                ) from cause
        return results

    def kill(self) -> None:
        import ray

        for handle in self.handles:
            ray.kill(handle, no_restart=True)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
