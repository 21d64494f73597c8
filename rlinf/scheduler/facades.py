"""Role facades: the runner calls coarse verbs; each facade owns "shard -> call every rank -> merge".

- `ActorGroup`: every rank receives the whole batch through ONE object-store reference (ray.put
  once) and takes its own data-parallel rows (the backend's `dp_info()`; see
  rlinf.workers.actor.base). `compute_logprobs` places the reporting ranks' logprob rows into the
  batch; `train` reuses that upload and returns one reporting rank's metrics (already all-reduced
  inside the update);
  `save`/`load`/`offload`/`onload` are collective (every rank is called).
- `RolloutGroup`: one rank per engine. `generate` gives engine i the i-th contiguous share of the
  prompts (whole GRPO groups) and concatenates the results, renumbering group ids so that engines
  never collide. `generate_partial` deals the step's groups out in turn (carried groups, listed
  first, spread over the engines) with the same quota shares. `sleep()` / `wake(tags)` reach every
  engine.
- `RewardGroup`: `score` sends the response texts, their lengths and the reference answers to the
  one reward worker (its grading pool has `reward.num_workers` processes) and fills the batch with
  what comes back.

Each facade still answers the raw WorkerGroup calls (`call`, `call_async`, `call_each`,
`call_rank0`, `get`, `handles`, `pids`, `kill`), which weight sync uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from rlinf.data.batch import RolloutBatch
from rlinf.data.metrics_merge import merge_metrics
from rlinf.scheduler.worker_group import WorkerGroup
from rlinf.workers.actor.base import LogprobRows, with_logprobs
from rlinf.workers.rollout.partial import GroupInFlight, PartialRollout

SEED_STRIDE = 0x9E3779B97F4A7C15  # engine i samples with seed + i * stride: streams never coincide


def engine_seed(seed: int, engine: int) -> int:
    """Engine 0 keeps the step's seed, so one engine samples exactly what it always did."""
    return (seed + engine * SEED_STRIDE) % (2**63)


def contiguous_shares(items: Sequence[Any], n: int) -> list[list[Any]]:
    """n consecutive shares of `items` whose sizes differ by at most one."""
    return [list(items[i * len(items) // n : (i + 1) * len(items) // n]) for i in range(n)]


def quota_shares(sizes: Sequence[int], keep: int) -> list[int]:
    """`keep` split over shares of `sizes` items in proportion, none above its share's size."""
    if not 0 <= keep <= sum(sizes):
        raise ValueError(f"cannot keep {keep} of {sum(sizes)} items")
    total = sum(sizes) or 1
    out = [keep * size // total for size in sizes]
    for i in sorted(range(len(sizes)), key=lambda i: -(keep * sizes[i] % total)):  # largest remainders
        if sum(out) == keep:
            break
        if out[i] < sizes[i]:
            out[i] += 1
    return out


class GroupFacade:
    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    # The raw group verbs, for weight sync and tests.
    @property
    def role(self) -> str:
        return self.group.role

    @property
    def handles(self) -> list:
        return self.group.handles

    def __len__(self) -> int:
        return len(self.group)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        return self.group.call(method, *args, **kwargs)

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> list:
        return self.group.call_async(method, *args, **kwargs)

    def call_each(self, method: str, per_rank_args: Sequence[tuple | None]) -> list:
        return self.group.call_each(method, per_rank_args)

    def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.group.call_rank0(method, *args, **kwargs)

    def get(self, refs: list) -> list:
        return self.group.get(refs)

    def pids(self) -> list[int]:
        return self.group.pids()

    def kill(self) -> None:
        self.group.kill()

    def device_memory_used_gib(self) -> float | None:
        """The fullest GPU among this group's ranks (all processes on it); None without CUDA."""
        used = [u for u in self.group.device_memory_used_gib() if u is not None]
        return max(used) if used else None

    def device_memory_total_gib(self) -> float | None:
        """The smallest GPU among this group's ranks; None without CUDA."""
        totals = [t for t in self.group.device_memory_total_gib() if t is not None]
        return min(totals) if totals else None

    def empty_device_cache(self) -> None:
        """Every rank hands its cached, unused GPU blocks back (a colocated engine needs them)."""
        self.group.empty_device_cache()


class ActorGroup(GroupFacade):
    def __init__(self, group: WorkerGroup) -> None:
        super().__init__(group)
        infos = group.call("dp_info")
        sizes = {info.size for info in infos}
        reporting = sorted((info.rank, rank) for rank, info in enumerate(infos) if info.reports)
        if len(sizes) != 1 or [dp for dp, _ in reporting] != list(range(infos[0].size)):
            raise RuntimeError(
                f"actor ranks report inconsistent data parallelism: {[(i.rank, i.size, i.reports) for i in infos]}; "
                "exactly one reporting rank per data-parallel rank is needed"
            )
        self.dp_size = infos[0].size
        self.reporting_ranks = [rank for _, rank in reporting]  # worker rank of dp rank 0, 1, ...
        self._uploaded: tuple[RolloutBatch | None, Any] = (None, None)  # compute_logprobs' result and upload

    def compute_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        """`batch` with the recomputed logprobs: each reporting rank sends its rows' tensors only.
        Handing the returned batch to `train` reuses this upload (see `train`)."""
        import ray

        uploaded = ray.put(batch)
        results = self.group.call("compute_logprobs", uploaded)
        parts = [results[rank] for rank in self.reporting_ranks]
        if any(part is None for part in parts):
            raise RuntimeError(f"actor: reporting ranks {self.reporting_ranks} returned {parts}")
        merged = with_logprobs(batch, parts)
        self._uploaded = (merged, uploaded)
        return merged

    def train(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        """Given the batch `compute_logprobs` just returned, the ranks get that call's upload plus
        the merged logprob tensors (uploaded once for all ranks); any other batch is uploaded whole."""
        import ray

        merged, uploaded = self._uploaded
        self._uploaded = (None, None)
        if batch is merged and uploaded is not None:
            logprobs = LogprobRows(0, batch.old_logprobs, batch.ref_logprobs)
            results = self.group.call("train", uploaded, step, ray.put(logprobs))
        else:
            results = self.group.call("train", ray.put(batch), step)
        return results[self.reporting_ranks[0]]

    def save(self, directory: str) -> int:
        """Collective; returns the optimizer steps the saved state has taken."""
        return self.group.call("save", directory)[self.reporting_ranks[0]]

    def load(self, directory: str) -> None:
        self.group.call("load", directory)

    def export_hf(self, directory: str) -> None:
        self.group.call("export_hf", directory)

    def offload(self) -> dict[str, float]:
        """Collective; the reporting ranks' metrics (e.g. memory freed), averaged."""
        results = self.group.call("offload")
        reported = [results[rank] for rank in self.reporting_ranks]
        return merge_metrics(reported, [1.0] * len(reported))

    def onload(self) -> None:
        self.group.call("onload")


class RolloutGroup(GroupFacade):
    def generate(
        self, prompts: Sequence[Any], n: int, params: Any, seed: int, keep_groups: int | None = None
    ) -> RolloutBatch:
        """`keep_groups`: each engine keeps its even share of that many groups (the first of its own
        prompts' groups to complete) and ends its generation there."""
        shares = contiguous_shares(prompts, len(self.group))
        keeps: list[int | None] = [None] * len(shares)
        if keep_groups is not None:
            keeps = list(quota_shares([len(share) for share in shares], keep_groups))
        args = [
            (share, n, params, engine_seed(seed, engine), *((keep,) if keep is not None else ()))
            if share and keep != 0
            else None  # no prompts, or none of its groups to keep
            for engine, (share, keep) in enumerate(zip(shares, keeps, strict=True))
        ]
        return RolloutBatch.concat([r for r in self.group.call_each("generate", args) if r is not None])

    def generate_partial(
        self, groups: Sequence[GroupInFlight], params: Any, seed: int, keep_groups: int
    ) -> PartialRollout:
        """data.partial_rollout: engine i gets groups i, i + engines, ... (the carried groups, which
        hold the long responses, come first and so are spread) and its quota share of
        `keep_groups`; an engine with no group to keep leaves its groups untouched, carried."""
        engines = len(self.group)
        shares = [list(groups[engine::engines]) for engine in range(engines)]
        keeps = quota_shares([len(share) for share in shares], keep_groups)
        args = [
            (share, params, engine_seed(seed, engine), keep) if share and keep else None
            for engine, (share, keep) in enumerate(zip(shares, keeps, strict=True))
        ]
        results = self.group.call_each("generate_partial", args)
        idle = [group for share, keep in zip(shares, keeps, strict=True) if not keep for group in share]
        return PartialRollout.concat([r for r in results if r is not None], idle)

    def sleep(self, tags: Sequence[str] | None = None) -> None:
        self.group.call("sleep", list(tags) if tags else None)

    def wake(self, tags: Sequence[str]) -> None:
        self.group.call("wake", list(tags))


class RewardGroup(GroupFacade):
    def score(self, batch: RolloutBatch) -> RolloutBatch:
        """`batch` with rewards, correctness and `reward/timeouts` (and, with overlong shaping, the
        raw rewards); only the response texts, their lengths and the reference answers go to the
        (single) reward worker."""
        lengths = batch.response_mask.sum(1).tolist()
        result = self.group.call_rank0("score", batch.response_text, batch.solutions, lengths)
        rewards = torch.tensor(result.rewards, dtype=torch.float32)
        raw_rewards = None
        if result.overlong_penalties is not None:
            raw_rewards = rewards - torch.tensor(result.overlong_penalties, dtype=torch.float32)
        return replace(
            batch,
            rewards=rewards,
            raw_rewards=raw_rewards,
            correct=torch.tensor(result.correct, dtype=torch.bool),
            extras={**batch.extras, "reward/timeouts": float(result.timeouts)},
        )
