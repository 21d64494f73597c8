"""Token logprobs (and entropy) of given responses under a causal LM, in the RolloutBatch layout.

Used by the actor for the logprob recompute and inside the training loss, so gradients flow. The
torch rollout backend reports logprobs under the same convention (see `rlinf.workers.rollout.sampling`):
logits divided by the temperature, log-softmax in fp32 over the full vocabulary.
"""

from __future__ import annotations

import torch


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count only real tokens, so left padding does not shift positions.

    Padding gets position 0 (left) or repeats the last real position (right); the mask hides it anyway.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 logits of the tempered distribution; temperature <= 0 (greedy) reports temperature 1.

    Rollout and actor both go through here so that their logprobs match bit for bit on the same logits.
    """
    logits = logits.float()
    return logits if temperature <= 0 or temperature == 1.0 else logits / temperature


def entropy_from_logprobs(logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy over the last dim from a log_softmax output (finite for finite logits)."""
    return -(logprobs.exp() * logprobs).sum(-1)


def response_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs [B, R] of `response_ids` after left-padded prompts, and optionally the entropy [B, R].

    One forward over cat(prompt, response). Only the R positions that predict response tokens are
    projected to the vocabulary and upcast, so the prompt never costs a [B, P, V] fp32 tensor.
    Masked response positions are 0 in both outputs.
    """
    response_mask = response_mask.bool()
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask.bool(), response_mask], dim=1)
    num_response = response_ids.shape[1]
    # Column P-1 (last prompt token) predicts response token 0; the last column predicts nothing.
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=num_response + 1,
    ).logits[:, :-1]
    all_logprobs = scale_logits(logits, temperature).log_softmax(-1)
    logprobs = all_logprobs.gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
    logprobs = logprobs.masked_fill(~response_mask, 0.0)
    if not with_entropy:
        return logprobs, None
    entropy = entropy_from_logprobs(all_logprobs).masked_fill(~response_mask, 0.0)
    return logprobs, entropy
