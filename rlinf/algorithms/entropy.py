"""Entropy of the token distribution, for the entropy bonus and the `actor/entropy` metric."""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy [...] of softmax(`logits` [..., V]) over the last dimension.

    H = logsumexp(z) - sum(softmax(z) * z) never forms log(p), so tokens of vanishing probability
    cannot produce 0 * -inf, and large logits cannot overflow. Logits must be finite.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
