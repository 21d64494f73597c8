"""The rollout role: samples responses with token logprobs; takes weights from the actor."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

from rlinf.data.batch import RolloutBatch
from rlinf.data.datasets import PromptItem
from rlinf.weight_sync.plan import OBJECT_STORE
from rlinf.workers.rollout.group_quota import GroupQuota
from rlinf.workers.rollout.partial import GroupInFlight, PartialRollout
from rlinf.workers.rollout.sampling import SamplingParams

WeightBucket = list[tuple[str, torch.Tensor]]


class RolloutWorker(ABC):
    tokenizer: Any  # the policy's tokenizer, set by each worker

    def response_text(self, ids: list[int]) -> str:
        """A response's text for the grader: its tokens decoded, special tokens left out."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    @abstractmethod
    def generate(
        self,
        prompts: Sequence[PromptItem],
        n: int,
        params: SamplingParams,
        seed: int,
        keep_groups: int | None = None,
    ) -> RolloutBatch:
        """n responses per prompt; rows of one prompt share a group index. `keep_groups`: end as
        soon as that many prompts have all n responses finished, and return only those groups
        (group_quota.py); None: every prompt's."""

    @abstractmethod
    def generate_partial(
        self, groups: Sequence[GroupInFlight], params: SamplingParams, seed: int, keep_groups: int
    ) -> PartialRollout:
        """data.partial_rollout: generate on every unfinished response of `groups` (continuing the
        carried ones) until `keep_groups` groups are complete; those become the batch, the others
        are returned to carry (partial.py)."""

    @abstractmethod
    def update_weights(self, buckets: Sequence[WeightBucket]) -> None:
        """Load the actor's weights (HF names) into the engine."""

    def weight_sync_info(self) -> dict:
        """How this rollout takes weights (rlinf.weight_sync.plan strategies); embedded: the object store."""
        return {"methods": (OBJECT_STORE,)}

    @abstractmethod
    def sleep(self, tags: Sequence[str] | None = None) -> None:
        """Colocated runs: release the accelerator memory of `tags` (None = all: KV cache, CUDA
        graphs and weights) so the actor can train. Idempotent. Weights released here may be lost:
        the runner always syncs them again after `wake(["weights"])`."""

    @abstractmethod
    def wake(self, tags: Sequence[str] | None = None) -> None:
        """Re-acquire the memory of `tags` (a subset of MEMORY_TAGS; None = all). Idempotent.
        The runner's colocated order: wake(["weights"]) -> weight sync -> actor offload ->
        wake(["kv_cache", "cuda_graph"]); a backend without a tag's memory ignores that tag."""

    def close(self) -> None:  # noqa: B027 - most backends hold nothing outside their process
        """At the end of a run: stop what outlives the worker's process (an engine's own processes)."""


MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


def group_quota(num_prompts: int, n: int, keep_groups: int | None) -> GroupQuota | None:
    """The quota over the prompt-major rows of one generate call (None when every group is kept)."""
    if keep_groups is None:
        return None
    return GroupQuota([row // n for row in range(num_prompts * n)], keep_groups)


def kept_groups(batch: RolloutBatch, quota: GroupQuota | None) -> RolloutBatch:
    """The rows of the groups the quota kept, groups renumbered from 0, widths trimmed."""
    if quota is None:
        return batch
    return RolloutBatch.concat([batch.select(quota.kept_rows())]).trimmed()


def check_memory_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    """The tags to act on (None = all); an unknown tag is an error naming the valid ones."""
    if tags is None:
        return MEMORY_TAGS
    unknown = [t for t in tags if t not in MEMORY_TAGS]
    if unknown:
        raise ValueError(f"unknown rollout memory tag(s) {unknown}; valid: {', '.join(MEMORY_TAGS)}")
    return tuple(tags)
