"""Partial rollout (`data.partial_rollout`, docs/rollout.md): the groups a quota-ended rollout did
not complete are carried into the next step instead of dropped.

A step's groups are `GroupInFlight`s: fresh ones (every response still to generate) and the ones
carried from the step before (some responses finished, the others stopped part-way). Each
unfinished response becomes one request (`continuations`): its prompt followed by its tokens so
far, with the budget it has left. The quota counts a group complete once all its responses are;
the kept groups become the step's RolloutBatch, the others are carried again with what they gained
(`finish_step`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from rlinf.data.batch import RolloutBatch, padded_rows
from rlinf.data.datasets import PromptItem
from rlinf.workers.rollout.group_quota import GroupQuota

FINISHED = ("stop", "length")


@dataclass(frozen=True)
class ResponseSoFar:
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()  # the rollout's logprob of each token, from the step that made it
    finish_reason: str | None = None  # "stop" (EOS) or "length" once finished; None while unfinished

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def extended(self, piece: Piece, max_new_tokens: int) -> ResponseSoFar:
        """This response followed by a continuation. An aborted continuation leaves it unfinished,
        unless it reached `max_new_tokens` (an abort that raced the length limit)."""
        if len(piece.token_ids) != len(piece.logprobs):
            raise ValueError(f"{len(piece.token_ids)} continuation tokens but {len(piece.logprobs)} logprobs")
        token_ids = self.token_ids + tuple(piece.token_ids)
        if len(token_ids) > max_new_tokens:
            raise ValueError(f"a response of {len(token_ids)} tokens exceeds max_new_tokens={max_new_tokens}")
        reason = piece.finish_reason if piece.finish_reason in FINISHED else None
        if reason is None and len(token_ids) == max_new_tokens:
            reason = "length"
        return ResponseSoFar(token_ids, self.logprobs + tuple(piece.logprobs), reason)


@dataclass(frozen=True)
class Piece:
    """What one request generated: tokens, their logprobs, and "stop" / "length" / "abort"."""

    token_ids: Sequence[int]
    logprobs: Sequence[float]
    finish_reason: str


@dataclass(frozen=True)
class GroupInFlight:
    item: PromptItem
    responses: tuple[ResponseSoFar, ...]
    steps: int = 0  # rollout steps it was generated in: its tokens come from at most this many policies

    @classmethod
    def fresh(cls, item: PromptItem, n: int) -> GroupInFlight:
        return cls(item, (ResponseSoFar(),) * n)

    @property
    def complete(self) -> bool:
        return all(r.finished for r in self.responses)

    @property
    def num_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.responses)


@dataclass(frozen=True)
class Continuation:
    """One unfinished response to generate on: `input_ids` = prompt + its tokens so far."""

    group: int
    response: int
    input_ids: list[int]
    generated: int  # tokens it already has
    max_new_tokens: int  # the budget it has left


def continuations(groups: Sequence[GroupInFlight], max_new_tokens: int) -> list[Continuation]:
    """The requests of a step: every unfinished response, group-major."""
    requests = []
    for g, group in enumerate(groups):
        for r, response in enumerate(group.responses):
            if response.finished:
                continue
            left = max_new_tokens - len(response.token_ids)
            if left < 1:  # it would have finished by length
                raise ValueError(f"group {g} response {r}: unfinished with {len(response.token_ids)} tokens")
            ids = [*group.item.prompt_ids, *response.token_ids]
            requests.append(Continuation(g, r, ids, len(response.token_ids), left))
    return requests


def step_quota(groups: Sequence[GroupInFlight], requests: Sequence[Continuation], keep: int) -> GroupQuota:
    """The quota over the requests (rows); groups with nothing left to generate are complete first."""
    done = [g for g, group in enumerate(groups) if group.complete]
    return GroupQuota([c.group for c in requests], keep, complete=done)


@dataclass
class PartialRollout:
    batch: RolloutBatch  # the kept groups, whole
    carried: list[GroupInFlight]  # the others, to generate on in the next step
    carried_tokens: int  # tokens of the batch's responses generated in earlier steps
    max_carry_steps: int  # the most steps a kept group was generated in (1: nothing carried)

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/carried_groups": float(len(self.carried)),
            "rollout/carried_tokens": float(self.carried_tokens),
            "rollout/max_carry_steps": float(self.max_carry_steps),
        }

    @staticmethod
    def concat(parts: Sequence[PartialRollout], idle: Sequence[GroupInFlight] = ()) -> PartialRollout:
        """Several engines' results (group ids renumbered); `idle`: groups no engine generated on,
        carried unchanged."""
        return PartialRollout(
            RolloutBatch.concat([p.batch for p in parts]),
            [group for p in parts for group in p.carried] + list(idle),
            sum(p.carried_tokens for p in parts),
            max(p.max_carry_steps for p in parts),
        )


def finish_step(
    groups: Sequence[GroupInFlight],
    requests: Sequence[Continuation],
    pieces: Sequence[Piece],
    quota: GroupQuota,
    pad_id: int,
    decode: Callable[[list[int]], str],
) -> PartialRollout:
    """Append each request's piece to its response; the groups the quota kept become the batch (in
    group order), the others are carried."""
    if len(pieces) != len(requests):
        raise ValueError(f"{len(pieces)} generated pieces for {len(requests)} requests")
    responses = [list(group.responses) for group in groups]
    for request, piece in zip(requests, pieces, strict=True):
        so_far = responses[request.group][request.response]
        limit = request.generated + request.max_new_tokens
        responses[request.group][request.response] = so_far.extended(piece, limit)
    after = [
        replace(group, responses=tuple(rs), steps=group.steps + 1)
        for group, rs in zip(groups, responses, strict=True)
    ]
    kept = quota.kept_groups()
    kept_set = set(kept)
    return PartialRollout(
        batch=groups_batch([after[g] for g in kept], pad_id, decode),
        carried=[group for g, group in enumerate(after) if g not in kept_set],
        carried_tokens=sum(groups[g].num_tokens for g in kept),
        max_carry_steps=max(after[g].steps for g in kept),
    )


def groups_batch(
    groups: Sequence[GroupInFlight], pad_id: int, decode: Callable[[list[int]], str]
) -> RolloutBatch:
    """Complete groups as a RolloutBatch: prompts left-padded, responses right-padded."""
    rows = [(group.item, response) for group in groups for response in group.responses]
    if any(not response.finished or not response.token_ids for _, response in rows):
        raise ValueError("a batch needs complete groups whose responses are not empty")
    padded = padded_rows(
        [item.prompt_ids for item, _ in rows],
        [response.token_ids for _, response in rows],
        [response.logprobs for _, response in rows],
        pad_id,
    )
    return RolloutBatch(
        prompt_ids=padded.prompt_ids,
        prompt_mask=padded.prompt_mask,
        response_ids=padded.response_ids,
        response_mask=padded.response_mask,
        group_index=torch.tensor([g for g, group in enumerate(groups) for _ in group.responses]),
        rollout_logprobs=padded.logprobs,
        finish_reasons=[str(response.finish_reason) for _, response in rows],
        response_text=[decode(list(response.token_ids)) for _, response in rows],
        solutions=[item.solutions for item, _ in rows],
    )


def groups_to_json(groups: Sequence[GroupInFlight]) -> list[dict[str, Any]]:
    """Plain data for a checkpoint; floats survive JSON exactly (shortest round-trip repr)."""
    return [
        {
            "item": {
                "prompt_ids": list(group.item.prompt_ids),
                "prompt_text": group.item.prompt_text,
                "solutions": list(group.item.solutions),
                "source": group.item.source,
            },
            "steps": group.steps,
            "responses": [
                {
                    "token_ids": list(r.token_ids),
                    "logprobs": list(r.logprobs),
                    "finish_reason": r.finish_reason,
                }
                for r in group.responses
            ],
        }
        for group in groups
    ]


def groups_from_json(data: Sequence[dict[str, Any]]) -> list[GroupInFlight]:
    return [
        GroupInFlight(
            item=PromptItem(
                prompt_ids=tuple(int(t) for t in g["item"]["prompt_ids"]),
                prompt_text=str(g["item"]["prompt_text"]),
                solutions=tuple(str(s) for s in g["item"]["solutions"]),
                source=str(g["item"]["source"]),
            ),
            responses=tuple(
                ResponseSoFar(
                    tuple(int(t) for t in r["token_ids"]),
                    tuple(float(x) for x in r["logprobs"]),
                    None if r["finish_reason"] is None else str(r["finish_reason"]),
                )
                for r in g["responses"]
            ),
            steps=int(g["steps"]),
        )
        for g in data
    ]
