"""Recorded routing travels with the RolloutBatch (select, trim, shard, concat) and is laid out in
each trainer forward's token order (rlinf.data.routing), checked on hand-made batches."""

import torch

from rlinf.data.batch import RolloutBatch
from rlinf.data.routing import (
    packed_targets,
    packed_thd_targets,
    padded_targets,
    recorded_mask,
    right_padded_targets,
    routing_bytes,
)

LAYERS, K = 2, 2


def _batch(prompts, responses, group_index=None):
    """Rows with the given real prompt / response lengths; token ids and experts encode
    (row, position in the row's real sequence) so every misplacement is visible."""
    p_width, r_width = max(prompts), max(responses)
    rows = len(prompts)
    prompt_ids = torch.zeros(rows, p_width, dtype=torch.long)
    prompt_mask = torch.zeros(rows, p_width, dtype=torch.bool)
    response_ids = torch.zeros(rows, r_width, dtype=torch.long)
    response_mask = torch.zeros(rows, r_width, dtype=torch.bool)
    prompt_experts = torch.zeros(rows, p_width, LAYERS, K, dtype=torch.uint8)
    response_experts = torch.zeros(rows, r_width, LAYERS, K, dtype=torch.uint8)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        for t in range(p + r):
            code = _code(i, t)
            if t < p:
                column = p_width - p + t
                prompt_ids[i, column], prompt_mask[i, column] = code, True
                prompt_experts[i, column] = _experts(code)
            else:
                column = t - p
                response_ids[i, column], response_mask[i, column] = code, True
                if t < p + r - 1:  # the last token is never routed by the rollout
                    response_experts[i, column] = _experts(code)
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        group_index=torch.arange(rows) if group_index is None else torch.tensor(group_index),
        rollout_logprobs=torch.zeros(rows, r_width),
        finish_reasons=["stop"] * rows,
        response_text=[""] * rows,
        solutions=[("0",)] * rows,
        prompt_experts=prompt_experts,
        response_experts=response_experts,
    )


def _code(row, t):
    return 1 + row * 20 + t  # < 256


def _experts(code):
    return torch.tensor([[code, (code + 1) % 256], [(code + 2) % 256, (code + 3) % 256]], dtype=torch.uint8)


def _rows_of(batch):
    """Per row: the real token ids, in order (the independent view of where each token is)."""
    ids = torch.cat([batch.prompt_ids, batch.response_ids], 1)
    mask = torch.cat([batch.prompt_mask, batch.response_mask], 1)
    return [ids[i][mask[i]].tolist() for i in range(len(batch))]


def test_recorded_mask_drops_padding_and_each_rows_last_token():
    prompt_mask = torch.tensor([[False, True, True], [True, True, True]])
    response_mask = torch.tensor([[True, True, False], [True, False, False]])
    assert recorded_mask(prompt_mask, response_mask).tolist() == [
        [False, True, True, True, False, False],
        [True, True, True, False, False, False],
    ]


def test_padded_layout_is_the_forward_over_prompt_then_response_row_major():
    batch = _batch([3, 1, 2], [2, 4, 1])
    targets, recorded = padded_targets(batch)
    tokens = batch.input_ids.flatten()
    assert targets.shape == (tokens.numel(), LAYERS, K)
    for token, target, rec in zip(tokens.tolist(), targets, recorded.tolist(), strict=True):
        if rec:
            assert torch.equal(target, _experts(token).long())
    assert int(recorded.sum()) == int(batch.attention_mask.sum()) - len(batch)


def test_packed_layout_is_the_real_tokens_row_after_row():
    batch = _batch([3, 1, 2], [2, 4, 1])
    targets, recorded = packed_targets(batch)
    tokens = [t for row in _rows_of(batch) for t in row]
    assert len(targets) == len(tokens)
    ends = {row[-1] for row in _rows_of(batch)}  # each row's last token has no record
    for token, target, rec in zip(tokens, targets, recorded.tolist(), strict=True):
        assert rec == (token not in ends)
        if rec:
            assert torch.equal(target, _experts(token).long())


def test_megatron_layout_is_right_padded_sequence_major_and_split_for_sequence_parallel():
    batch = _batch([3, 1, 2], [2, 4, 1])
    r = batch.response_ids.shape[1]
    width = 8  # >= longest prompt + R, a multiple of 2
    full, full_rec = right_padded_targets(batch, width)
    # megatron's rows: the real prompt, then all R response columns, then zeros; seen [width, rows]
    tokens = torch.zeros(len(batch), width, dtype=torch.long)
    for i, p in enumerate(batch.prompt_mask.sum(1).tolist()):
        tokens[i, :p] = batch.prompt_ids[i, -p:]
        tokens[i, p : p + r] = batch.response_ids[i]
    seq_major = tokens.t().flatten()
    for token, target, rec in zip(seq_major.tolist(), full, full_rec.tolist(), strict=True):
        if rec:
            assert torch.equal(target, _experts(token).long())
    assert int(full_rec.sum()) == int(batch.attention_mask.sum()) - len(batch)
    halves = [right_padded_targets(batch, width, tp_rank=k, tp_size=2) for k in range(2)]
    assert torch.equal(torch.cat([h[0] for h in halves]), full)
    assert torch.equal(torch.cat([h[1] for h in halves]), full_rec)
    assert len(halves[0][0]) == width // 2 * len(batch)


def test_megatron_packed_layout_pads_the_row_and_splits_it_for_sequence_parallel():
    batch = _batch([3, 1, 2], [2, 4, 1])
    real, real_rec = packed_targets(batch)
    width = 16  # 13 real tokens + 3 padding, 4 sequence-parallel chunks of 4
    full, full_rec = packed_thd_targets(batch, width)
    assert torch.equal(full[: len(real)], real) and torch.equal(full_rec[: len(real)], real_rec)
    assert not bool(full_rec[len(real) :].any())
    chunks = [packed_thd_targets(batch, width, tp_rank=k, tp_size=4) for k in range(4)]
    assert torch.equal(torch.cat([c[0] for c in chunks]), full)
    assert [len(c[0]) for c in chunks] == [4] * 4


def test_routing_travels_through_select_trim_shard_and_concat():
    batch = _batch([3, 1, 2, 5], [2, 4, 1, 1], group_index=[0, 0, 1, 1])
    assert routing_bytes(batch) == batch.prompt_experts.numel() + batch.response_experts.numel()
    # a DP shard / engine share keeps each row's routing with its tokens
    for part in batch.shard(2):
        trimmed = part.trimmed()
        targets, recorded = padded_targets(trimmed)
        for token, target, rec in zip(
            trimmed.input_ids.flatten().tolist(), targets, recorded.tolist(), strict=True
        ):
            if rec:
                assert torch.equal(target, _experts(token).long())
    # parts of different widths (two engines) concatenate back, padded on the correct side
    parts = [p.trimmed() for p in batch.shard(2)]
    assert parts[0].prompt_ids.shape[1] != parts[1].prompt_ids.shape[1]
    merged = RolloutBatch.concat(parts)
    original, _ = packed_targets(batch)
    again, _ = packed_targets(merged)
    assert torch.equal(again, original)
    assert merged.prompt_experts.shape[:2] == merged.prompt_ids.shape
    assert merged.response_experts.shape[:2] == merged.response_ids.shape
