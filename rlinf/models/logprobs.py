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


# Rows per fp32 chunk: 2**28 fp32 values (1 GiB) at most, so a 16k-token micro-batch over a
# 163840 vocabulary never holds its [tokens x vocab] fp32 logits (10.7 GB) or their fp32 gradient.
CHUNK_LOGITS = 2**28


def response_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs [B, R] of `response_ids` after left-padded prompts, and optionally the entropy [B, R].

    One forward over cat(prompt, response) to the last hidden states; only the positions that
    predict a real (unmasked) response token are projected to the vocabulary, in the model's dtype.
    The fp32 log-softmax runs `chunk_tokens` rows at a time (default CHUNK_LOGITS // vocab), forward
    and backward (`ChunkedTokenLogprobs`), so no [tokens, V] fp32 tensor ever exists. Masked
    response positions are 0 in both outputs. The values equal one unchunked fp32 log_softmax over
    the same logits (`reference_response_logprobs`) within fp32 rounding.

    `packed`: one forward over a single row holding every sequence's real tokens back to back, no
    padding (`pack_rows`); the position ids restart at 0 for each sequence, which transformers'
    masks read as packed sequences (block-diagonal causal attention). Same values as the padded
    forward within the kernels' rounding; the cost is the real tokens instead of rows x width.
    """
    response_mask = response_mask.bool()
    attention_mask = torch.cat([prompt_mask.bool(), response_mask], dim=1)
    num_prompt, num_response = prompt_ids.shape[1], response_ids.shape[1]
    if packed:
        forward_kwargs, where = pack_rows(torch.cat([prompt_ids, response_ids], dim=1), attention_mask)
        predicting = packed_predictors(where, num_prompt, response_mask)
    else:
        forward_kwargs = dict(
            input_ids=torch.cat([prompt_ids, response_ids], dim=1),
            attention_mask=attention_mask,
            position_ids=positions_from_mask(attention_mask),
        )
    forward_kwargs["use_cache"] = False
    head = _output_head(model)
    if head is None:  # no separable vocabulary projection: take the model's logits
        if packed:
            logits = model(**forward_kwargs).logits[0, predicting]
        else:
            logits = model(**forward_kwargs, logits_to_keep=num_response + 1).logits
            logits = logits[:, :-1][response_mask]
    else:
        hidden = head.body(**forward_kwargs).last_hidden_state
        if packed:
            logits = head.linear(hidden[0, predicting])
        else:
            # Column P-1 (last prompt token) predicts response token 0; the last column predicts nothing.
            logits = head.linear(hidden[:, num_prompt - 1 : num_prompt - 1 + num_response][response_mask])
    size = chunk_tokens or max(1, CHUNK_LOGITS // logits.shape[-1])
    token_logprobs, entropy = ChunkedTokenLogprobs.apply(
        logits, response_ids[response_mask], temperature, size, with_entropy
    )
    token_logprobs = token_logprobs.new_zeros(response_mask.shape).masked_scatter(
        response_mask, token_logprobs
    )
    if not with_entropy:
        return token_logprobs, None
    return token_logprobs, entropy.new_zeros(response_mask.shape).masked_scatter(response_mask, entropy)


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """The real tokens of every row, back to back in one row, as forward keyword arguments (no
    attention mask; position ids 0..n-1 per sequence), and `where` [B, L]: the packed index of each
    real token of the padded layout (-1 at padding), so `x[0, where[mask]]` reads them row by row."""
    mask = attention_mask.bool()
    where = torch.full(mask.shape, -1, dtype=torch.long, device=mask.device)
    where[mask] = torch.arange(int(mask.sum()), device=mask.device)
    kwargs = dict(
        input_ids=input_ids[mask].unsqueeze(0),
        position_ids=positions_from_mask(mask)[mask].unsqueeze(0),
        attention_mask=None,
    )
    return kwargs, where


def packed_predictors(where: torch.Tensor, num_prompt: int, response_mask: torch.Tensor) -> torch.Tensor:
    """The packed position before each real response token, which predicts it (row-major order);
    `where` from `pack_rows` over cat(prompt [num_prompt columns], response)."""
    index = where[:, num_prompt - 1 : num_prompt - 1 + response_mask.shape[1]][response_mask.bool()]
    if bool((index < 0).any()):
        raise ValueError("packed logprobs need every real response token right after real tokens (no gaps)")
    return index


class ChunkedTokenLogprobs(torch.autograd.Function):
    """(log softmax(logits / T)[target], entropy) per row of logits [N, V], in fp32 chunks of rows.

    Saves only the logits (in their own dtype); backward recomputes each chunk's fp32 log-softmax
    and writes the logits' gradient chunk by chunk through the fused log-softmax backward, with
    d logprob / d logp = onehot and d entropy / d logp = -p (logp + 1) (the constant 1 cancels there).
    """

    @staticmethod
    def forward(ctx, logits, targets, temperature: float, chunk: int, with_entropy: bool):
        n = logits.shape[0]
        token = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = torch.zeros(n, dtype=torch.float32, device=logits.device)
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            logp = _tempered_log_softmax(logits[rows], temperature)
            token[rows] = logp.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1)
            if with_entropy:
                entropy[rows] = entropy_from_logprobs(logp)
        ctx.save_for_backward(logits, targets)
        ctx.temperature, ctx.chunk = temperature, chunk
        # An unused output (the entropy when it only feeds metrics) gets None, not a zero tensor
        # whose term backward would compute for nothing.
        ctx.set_materialize_grads(False)
        return token, entropy

    @staticmethod
    def backward(ctx, grad_token, grad_entropy):
        logits, targets = ctx.saved_tensors
        if grad_token is None and grad_entropy is None:
            return None, None, None, None, None
        temperature = ctx.temperature if ctx.temperature > 0 else 1.0
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            logp = _tempered_log_softmax(logits[rows], ctx.temperature)
            grad_logp = torch.zeros_like(logp)
            if grad_token is not None:
                grad_logp.scatter_(-1, targets[rows].unsqueeze(-1), grad_token[rows].unsqueeze(-1))
            if grad_entropy is not None:
                grad_logp -= logp.exp() * (logp + 1.0) * grad_entropy[rows].unsqueeze(-1)
            grad_z = torch.ops.aten._log_softmax_backward_data(grad_logp, logp, -1, torch.float32)
            grad_logits[rows] = grad_z.div_(temperature) if temperature != 1.0 else grad_z
        return grad_logits, None, None, None, None


def _tempered_log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 log_softmax(logits / T) of one chunk (`scale_logits`' convention), one fused kernel at T = 1."""
    if temperature <= 0 or temperature == 1.0:
        return torch.log_softmax(logits, -1, dtype=torch.float32)
    return logits.to(torch.float32, copy=True).div_(temperature).log_softmax(-1)


def reference_response_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The unchunked definition (full [B, R, V] fp32 log_softmax): what tests and benchmarks compare with."""
    response_mask = response_mask.bool()
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask.bool(), response_mask], dim=1)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=response_ids.shape[1] + 1,
    ).logits[:, :-1]
    all_logprobs = scale_logits(logits, temperature).log_softmax(-1)
    logprobs = (
        all_logprobs.gather(-1, response_ids.unsqueeze(-1)).squeeze(-1).masked_fill(~response_mask, 0.0)
    )
    entropy = entropy_from_logprobs(all_logprobs).masked_fill(~response_mask, 0.0)
    return logprobs, entropy


class _Head:
    def __init__(self, body: torch.nn.Module, linear: torch.nn.Linear) -> None:
        self.body, self.linear = body, linear


def _output_head(model: torch.nn.Module) -> _Head | None:
    """(decoder body, lm_head) of a transformers causal LM whose logits are lm_head(last hidden)."""
    get_head = getattr(model, "get_output_embeddings", None)
    body = getattr(model, "model", None)
    head = get_head() if callable(get_head) else None
    if isinstance(head, torch.nn.Linear) and isinstance(body, torch.nn.Module):
        return _Head(body, head)
    return None
