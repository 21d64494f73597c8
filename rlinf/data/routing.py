"""Recorded MoE routing laid out in the token order of each trainer forward.

A RolloutBatch carries the rollout's experts per token (`prompt_experts` [B, P, L, K], left-padded
like the prompts; `response_experts` [B, R, L, K], right-padded like the responses). Concatenated
they align with `batch.input_ids` column by column. A token has a record where the rollout fed it
through the model: every real prompt token and every real response token but the row's last one
(sampled, never fed back). Each function returns (targets [N, L, K] long, recorded [N] bool) for
the N tokens of one forward, in the order that forward's routers see them:

- `padded_targets`: the HF forward over cat(prompt, response) [B, T], row-major (torch actor);
- `packed_targets`: the real tokens of every row back to back (torch actor, packed; Megatron THD);
- `right_padded_targets`: Megatron's right-padded [B, T'] layout (each row's real prompt, then all
  its response columns, zero padding after), which megatron's routers see sequence-major ([T', B]
  flattened), and under sequence parallelism only this TP rank's contiguous chunk of T'.
"""

from __future__ import annotations

import torch

from rlinf.data.batch import RolloutBatch


def has_routing(batch: RolloutBatch) -> bool:
    return batch.prompt_experts is not None and batch.response_experts is not None


def routing_bytes(batch: RolloutBatch) -> int:
    """Bytes of the recorded routing the batch carries."""
    if not has_routing(batch):
        return 0
    return sum(t.numel() * t.element_size() for t in (batch.prompt_experts, batch.response_experts))  # type: ignore[union-attr]


def recorded_mask(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B, P + R] bool: the tokens the rollout routed (real tokens but each row's last)."""
    mask = torch.cat([prompt_mask.bool(), response_mask.bool()], dim=1)
    last = mask.shape[1] - 1 - mask.flip(1).long().argmax(1)
    out = mask.clone()
    out[torch.arange(mask.shape[0]), last] = False
    return out


def _columns(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(experts [B, P + R, L, K], real-token mask [B, P + R], recorded [B, P + R])."""
    if not has_routing(batch):
        raise ValueError("routing replay: the batch carries no recorded routing (prompt/response_experts)")
    experts = torch.cat([batch.prompt_experts, batch.response_experts], dim=1)  # type: ignore[list-item]
    mask = torch.cat([batch.prompt_mask.bool(), batch.response_mask.bool()], dim=1)
    if experts.shape[:2] != mask.shape:
        raise ValueError(
            f"routing replay: experts {tuple(experts.shape)} do not match the tokens {tuple(mask.shape)}"
        )
    return experts, mask, recorded_mask(batch.prompt_mask, batch.response_mask)


def padded_targets(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    experts, _, recorded = _columns(batch)
    return experts.flatten(0, 1).long(), recorded.flatten()


def packed_targets(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    experts, mask, recorded = _columns(batch)
    return experts[mask].long(), recorded[mask]


def right_padded_targets(
    batch: RolloutBatch, width: int, *, tp_rank: int = 0, tp_size: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron's right-padded rows of `width` columns (each row's real prompt, then all its
    response columns), as its routers see them: sequence-major, and with `tp_size` > 1 (sequence
    parallel) only the `tp_rank`-th of `tp_size` equal chunks of the sequence."""
    experts, mask, recorded = _columns(batch)
    rows, columns = mask.shape
    prompt_width = batch.prompt_ids.shape[1]
    out = experts.new_zeros((rows, width, *experts.shape[2:]))
    out_recorded = torch.zeros(rows, width, dtype=torch.bool)
    for i, p in enumerate(batch.prompt_mask.sum(1).tolist()):
        source = torch.arange(prompt_width - p, columns)  # the real prompt, then every response column
        out[i, : len(source)] = experts[i, source]
        out_recorded[i, : len(source)] = recorded[i, source]
    return _megatron_order(out, out_recorded, tp_rank, tp_size)


def packed_thd_targets(
    batch: RolloutBatch, width: int, *, tp_rank: int = 0, tp_size: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron's packed THD row: the real tokens back to back, then padding up to `width` (a
    multiple of `tp_size` under sequence parallelism); this TP rank's chunk of it."""
    targets, recorded = packed_targets(batch)
    pad = width - len(targets)
    if pad < 0:
        raise ValueError(f"routing replay: {len(targets)} packed tokens do not fit {width} columns")
    targets = torch.cat([targets, targets.new_zeros((pad, *targets.shape[1:]))])
    recorded = torch.cat([recorded, recorded.new_zeros(pad)])
    return _megatron_order(targets[None], recorded[None], tp_rank, tp_size)


def _megatron_order(
    targets: torch.Tensor, recorded: torch.Tensor, tp_rank: int, tp_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T, ...] -> megatron's [T, B] token order flattened, this rank's sequence chunk only."""
    width = targets.shape[1]
    if width % tp_size:
        raise ValueError(
            f"routing replay: {width} columns do not split over {tp_size} sequence-parallel ranks"
        )
    chunk = slice(tp_rank * width // tp_size, (tp_rank + 1) * width // tp_size)
    targets, recorded = targets[:, chunk], recorded[:, chunk]
    return targets.transpose(0, 1).flatten(0, 1).long(), recorded.transpose(0, 1).flatten()
