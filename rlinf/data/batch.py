"""RolloutBatch: the one typed record a GRPO step's data travels in between roles.

Layout: prompts are LEFT-padded to a common length P, responses RIGHT-padded to R, so that
`cat([prompt_ids, response_ids], 1)` puts every response token at the same column for every row
and position ids follow from the attention mask. Rollout and actor use this same layout, which is
what keeps their logprobs numerically identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch


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
    rewards: torch.Tensor | None = None  # [B] float
    correct: torch.Tensor | None = None  # [B] bool, grader verdict
    advantages: torch.Tensor | None = None  # [B] float, broadcast over the response tokens
    extras: dict[str, Any] = field(default_factory=dict)  # per-step scalars (e.g. reward timeouts)

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
        for name in ("response_ids", "response_mask", "rollout_logprobs", "old_logprobs", "ref_logprobs"):
            value = getattr(out, name)
            if value is not None:
                out = replace(out, **{name: value[:, :r_keep]})
        return out
