"""The reference the Megatron actor's response-rows LM head is checked against: GPTModel's own
output layer over every position (vocab-parallel logits [b, T, V / TP]), then the logits of the
positions that predict response tokens picked out and turned into logprobs and entropy (the actor's
path before the LM head ran on those rows only)."""

from __future__ import annotations

import torch

from rlinf.data.batch import RolloutBatch


def full_vocab_logprobs(actor, model, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    from rlinf.models.megatron.logprobs import vocab_parallel_logprobs

    mask = micro.response_mask.bool()
    if actor.cfg.actor.pack_sequences:
        tokens, positions, params, index = actor._packed_thd(micro)
        logits = model(
            input_ids=tokens, position_ids=positions, attention_mask=None, packed_seq_params=params
        )
        picked, targets = logits[:, index], micro.response_ids[mask][None]
    else:
        tokens, prompt_lens = actor._right_padded(micro)
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        logits = model(input_ids=tokens, position_ids=positions, attention_mask=None)
        index = (prompt_lens - 1)[:, None] + torch.arange(mask.shape[1])[None]
        picked = logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))[mask][None]
        targets = micro.response_ids[mask][None]
    logprobs, entropy = vocab_parallel_logprobs(
        picked, targets, temperature=actor.temperature, vocab_start=actor.tp_rank * logits.shape[-1],
        group=actor.tp_group,
    )  # fmt: skip
    zeros = torch.zeros(mask.shape, dtype=logprobs.dtype)
    return zeros.masked_scatter(mask, logprobs[0]), zeros.masked_scatter(mask, entropy[0])


def values_and_grads(model, forward) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Logprobs, entropy and every parameter's gradient of a fixed weighting of both."""
    model.zero_grad_buffer()
    logprobs, entropy = forward()
    weights = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1))
    ((logprobs * weights).sum() + 0.5 * entropy.sum()).backward()
    model.finish_grad_sync()
    grads = {n: p.main_grad.clone() for n, p in model.named_parameters()}
    return logprobs.detach(), entropy.detach(), grads


def largest_differences(actor, micro: RolloutBatch) -> dict[str, float]:
    """The response-rows path against the reference on this rank: the largest difference of the
    logprobs, the entropy and each gradient relative to its scale (and how many gradients are
    nonzero, so a test sees there was something to compare)."""
    model = actor.model[0]
    lp, ent, grads = values_and_grads(model, lambda: actor._logprobs(model, micro))
    ref_lp, ref_ent, ref_grads = values_and_grads(model, lambda: full_vocab_logprobs(actor, model, micro))
    assert grads.keys() == ref_grads.keys()
    scales = {n: float(g.abs().max()) for n, g in ref_grads.items()}
    return {
        "logprobs": float((lp - ref_lp).abs().max()),
        "entropy": float((ent - ref_ent).abs().max()),
        "grads": max(float((grads[n] - g).abs().max()) / (scales[n] + 1e-12) for n, g in ref_grads.items()),
        "nonzero_grads": float(sum(scale > 0 for scale in scales.values())),
        "masked_zero": float(lp[~micro.response_mask.bool()].abs().max())
        if (~micro.response_mask).any()
        else 0.0,
    }
