"""RolloutBatch: the one typed record a GRPO step's data travels in between roles.

Layout: prompts are LEFT-padded to a common length P, responses RIGHT-padded to R, so that
`cat([prompt_ids, response_ids], 1)` puts every response token at the same column for every row
and position ids follow from the attention mask. Rollout and actor use this same layout, which is
what keeps their logprobs numerically identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from rlinf.data.metrics_merge import merge_metrics

# Per-token fields, right-padded to the response width R.
RESPONSE_FIELDS = ("response_ids", "response_mask", "rollout_logprobs", "old_logprobs", "ref_logprobs")
# Per-token MoE routing recorded by the rollout (algorithm.routing_replay): [rows, columns, MoE
# layers, top_k] uint8, the prompt's left-padded like prompt_ids, the response's right-padded.
PROMPT_ROUTING = "prompt_experts"
RESPONSE_ROUTING = "response_experts"
# Per-row optional fields: present on every part or on none.
OPTIONAL_ROW_FIELDS = ("rewards", "raw_rewards", "correct", "advantages", "policy_version")


@dataclass
class RolloutBatch:
    prompt_ids: torch.Tensor  # [B, P] long, left-padded with pad_token_id
    prompt_mask: torch.Tensor  # [B, P] bool, True on real prompt tokens
    response_ids: torch.Tensor  # [B, R] long, right-padded with pad_token_id
    response_mask: torch.Tensor  # [B, R] bool, True on generated tokens (EOS included)
    group_index: torch.Tensor  # [B] long, responses to the same prompt share an index
    rollout_logprobs: torch.Tensor  # [B, R] float, logprobs reported by the rollout engine
    finish_reasons: list[str]  # "stop" (EOS) or "length" (hit max_new_tokens)
    response_text: list[str]  # decoded responses (what the grader reads)
    solutions: list[tuple[str, ...]]  # reference answers, one tuple per row
    old_logprobs: torch.Tensor | None = None  # [B, R] recomputed by the actor before training
    ref_logprobs: torch.Tensor | None = None  # [B, R] reference policy (only when kl_beta > 0)
    rewards: torch.Tensor | None = None  # [B] float, what the advantages are computed from
    raw_rewards: torch.Tensor | None = None  # [B] float, before overlong shaping; None without it
    correct: torch.Tensor | None = None  # [B] bool, grader verdict
    advantages: torch.Tensor | None = None  # [B] float, broadcast over the response tokens
    extras: dict[str, Any] = field(default_factory=dict)  # per-step scalars (e.g. reward timeouts)
    # [B] long: the actor updates the rollout's weights had seen when it generated each row (the
    # runner tags it; rlinf.runners.pipeline bounds how far it may lag the actor that trains the row)
    policy_version: torch.Tensor | None = None
    # [B, P, L, K] / [B, R, L, K] uint8: the experts the rollout routed each prompt / response token
    # to in each of the L MoE layers (rlinf.data.routing); 0 where nothing was routed (padding, and
    # the last response token, which is sampled but never fed back). None unless routing is recorded.
    prompt_experts: torch.Tensor | None = None
    response_experts: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum())

    def select(self, index: torch.Tensor | list[int]) -> RolloutBatch:
        """Rows `index` (in that order); tensors and lists alike."""
        idx = torch.as_tensor(index, dtype=torch.long)
        picked: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                picked[f.name] = value[idx]
            elif isinstance(value, list):
                picked[f.name] = [value[i] for i in idx.tolist()]
            else:
                picked[f.name] = value
        return replace(self, **picked)

    def split(self, size: int) -> list[RolloutBatch]:
        """Consecutive chunks of `size` rows (the last may be shorter)."""
        return [self.select(list(range(s, min(s + size, len(self))))) for s in range(0, len(self), size)]

    def trimmed(self) -> RolloutBatch:
        """Drop padding columns no row uses (left of prompts, right of responses)."""
        p_keep = int(self.prompt_mask.sum(1).max())
        r_keep = max(1, int(self.response_mask.sum(1).max()))
        out = replace(
            self,
            prompt_ids=self.prompt_ids[:, -p_keep:],
            prompt_mask=self.prompt_mask[:, -p_keep:],
        )
        if self.prompt_experts is not None:
            out = replace(out, prompt_experts=self.prompt_experts[:, -p_keep:])
        for name in (*RESPONSE_FIELDS, RESPONSE_ROUTING):
            value = getattr(out, name)
            if value is not None:
                out = replace(out, **{name: value[:, :r_keep]})
        return out

    def shard(self, n: int) -> list[RolloutBatch]:
        """n parts of whole GRPO groups (consecutive groups, counts differing by at most one).

        Rows keep their order; a part is empty when there are fewer groups than parts.
        """
        return [self.select(rows) for rows in self.shard_rows(n)]

    def shard_rows(self, n: int) -> list[list[int]]:
        """The row indices of each part of `shard(n)`."""
        if n < 1:
            raise ValueError(f"cannot shard a batch into {n} parts")
        groups = list(dict.fromkeys(self.group_index.tolist()))  # first-appearance order
        position = {g: i for i, g in enumerate(groups)}
        part_of_row = [position[g] * n // max(len(groups), 1) for g in self.group_index.tolist()]
        return [[r for r, p in enumerate(part_of_row) if p == k] for k in range(n)]

    @staticmethod
    def concat(parts: Sequence[RolloutBatch], *, renumber_groups: bool = True) -> RolloutBatch:
        """Rows of every part in order, padding prompts on the left and responses on the right.

        With `renumber_groups` (results of several engines, each numbering its groups from 0) the
        groups of part k get ids after those of parts < k, in first-appearance order, so ids never
        collide. Padding uses the pad id already found under the parts' masks (0 if none).
        `extras` are per-step scalars of each part, merged by rlinf.data.metrics_merge rules.
        """
        parts = [p for p in parts if len(p) > 0] or list(parts[:1])
        if not parts:
            raise ValueError("concat needs at least one batch")
        pad_id = _pad_id(parts)
        prompt_width = max(p.prompt_ids.shape[1] for p in parts)
        response_width = max(p.response_ids.shape[1] for p in parts)
        merged: dict[str, Any] = {}
        merged["prompt_ids"] = torch.cat([_pad_left(p.prompt_ids, prompt_width, pad_id) for p in parts])
        merged["prompt_mask"] = torch.cat([_pad_left(p.prompt_mask, prompt_width, False) for p in parts])
        for name in RESPONSE_FIELDS:
            values = [getattr(p, name) for p in parts]
            merged[name] = _cat_optional(
                name, [_pad_right(v, response_width, pad_id if name == "response_ids" else 0) for v in values]
            )
        merged[PROMPT_ROUTING] = _cat_optional(
            PROMPT_ROUTING, [_pad_left(p.prompt_experts, prompt_width, 0) for p in parts]
        )
        merged[RESPONSE_ROUTING] = _cat_optional(
            RESPONSE_ROUTING, [_pad_right(p.response_experts, response_width, 0) for p in parts]
        )
        for name in OPTIONAL_ROW_FIELDS:
            merged[name] = _cat_optional(name, [getattr(p, name) for p in parts])
        merged["group_index"] = (
            _renumbered(parts) if renumber_groups else torch.cat([p.group_index for p in parts])
        )
        for name in ("finish_reasons", "response_text", "solutions"):
            merged[name] = [item for p in parts for item in getattr(p, name)]
        weights = [float(p.num_response_tokens) for p in parts]
        merged["extras"] = merge_metrics([p.extras for p in parts], weights)
        return RolloutBatch(**merged)


def _renumbered(parts: Sequence[RolloutBatch]) -> torch.Tensor:
    out, offset = [], 0
    for part in parts:
        ids = part.group_index.tolist()
        local = {g: i for i, g in enumerate(dict.fromkeys(ids))}
        out.append(torch.tensor([offset + local[g] for g in ids], dtype=torch.long))
        offset += len(local)
    return torch.cat(out)


def _pad_id(parts: Sequence[RolloutBatch]) -> int:
    for part in parts:
        for ids, mask in ((part.prompt_ids, part.prompt_mask), (part.response_ids, part.response_mask)):
            hidden = ids[~mask.bool()]
            if hidden.numel():
                return int(hidden[0])
    return 0


def _pad_left(t: Any, width: int, value: Any) -> Any:
    """`t` padded on the left of dim 1 (its columns) to `width`; None stays None."""
    if t is None or t.shape[1] >= width:
        return t
    filler = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), value)
    return torch.cat([filler, t], dim=1)


def _pad_right(t: torch.Tensor | None, width: int, value: Any) -> torch.Tensor | None:
    """`t` padded on the right of dim 1 (its columns) to `width`; None stays None."""
    if t is None or t.shape[1] >= width:
        return t
    filler = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), value)
    return torch.cat([t, filler], dim=1)


def _cat_optional(name: str, values: list[torch.Tensor | None]) -> torch.Tensor | None:
    present = [v is not None for v in values]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"concat: field {name!r} is set on some parts and missing on others")
    return torch.cat(values)  # type: ignore[arg-type]


@dataclass
class PaddedRows:
    """Token lists in RolloutBatch's layout: prompts left-padded, responses right-padded."""

    prompt_ids: torch.Tensor  # [B, P] long
    prompt_mask: torch.Tensor  # [B, P] bool
    response_ids: torch.Tensor  # [B, R] long
    response_mask: torch.Tensor  # [B, R] bool
    logprobs: torch.Tensor  # [B, R] fp32, 0 on padding


def padded_rows(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    pad_id: int,
) -> PaddedRows:
    """One row per (prompt, response, its logprobs), in the layout above."""
    batch = len(prompts)
    prompt_len = max(len(p) for p in prompts)
    response_len = max(len(r) for r in responses)
    out = PaddedRows(
        torch.full((batch, prompt_len), pad_id, dtype=torch.long),
        torch.zeros((batch, prompt_len), dtype=torch.bool),
        torch.full((batch, response_len), pad_id, dtype=torch.long),
        torch.zeros((batch, response_len), dtype=torch.bool),
        torch.zeros((batch, response_len), dtype=torch.float32),
    )
    for row, (prompt, response, lp) in enumerate(zip(prompts, responses, logprobs, strict=True)):
        out.prompt_ids[row, prompt_len - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        out.prompt_mask[row, prompt_len - len(prompt) :] = True
        out.response_ids[row, : len(response)] = torch.tensor(list(response), dtype=torch.long)
        out.response_mask[row, : len(response)] = True
        out.logprobs[row, : len(response)] = torch.tensor(list(lp), dtype=torch.float32)
    return out
