"""RolloutBatch.shard / concat and the per-rank metric merge rules."""

import pytest
import torch

from rlinf.data.batch import RolloutBatch
from rlinf.data.metrics_merge import merge_metrics, merge_rule

PAD = 7


def make_batch(prompt_lens, response_lens, groups, *, base=0, rewards=True) -> RolloutBatch:
    """Token ids encode (row, position) so every row can be recognised after padding changes."""
    b, p, r = len(prompt_lens), max(prompt_lens), max(response_lens)
    prompt_ids = torch.full((b, p), PAD)
    prompt_mask = torch.zeros(b, p, dtype=torch.bool)
    response_ids = torch.full((b, r), PAD)
    response_mask = torch.zeros(b, r, dtype=torch.bool)
    logprobs = torch.zeros(b, r)
    for i, (pl, rl) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompt_ids[i, p - pl :] = torch.arange(pl) + 100 * (base + i + 1)
        prompt_mask[i, p - pl :] = True
        response_ids[i, :rl] = torch.arange(rl) + 100 * (base + i + 1) + 50
        response_mask[i, :rl] = True
        logprobs[i, :rl] = -(base + i + 1)
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        group_index=torch.tensor(groups),
        rollout_logprobs=logprobs,
        finish_reasons=["stop"] * b,
        response_text=[f"r{base + i}" for i in range(b)],
        solutions=[(str(base + i),) for i in range(b)],
        rewards=torch.arange(b, dtype=torch.float32) + base if rewards else None,
        extras={"reward/timeouts": 1.0},
    )


def rows(batch: RolloutBatch) -> list[tuple]:
    """Each row's real tokens and logprobs, independent of padding."""
    return [
        (
            tuple(batch.prompt_ids[i][batch.prompt_mask[i]].tolist()),
            tuple(batch.response_ids[i][batch.response_mask[i]].tolist()),
            tuple(batch.rollout_logprobs[i][batch.response_mask[i]].tolist()),
            batch.response_text[i],
        )
        for i in range(len(batch))
    ]


def test_shard_keeps_groups_whole_and_concat_restores_the_batch():
    batch = make_batch([2, 3, 1, 4, 2, 2], [1, 4, 2, 3, 1, 2], [0, 0, 1, 1, 2, 2])
    shards = batch.shard(2)
    assert [s.group_index.tolist() for s in shards] == [[0, 0, 1, 1], [2, 2]]
    back = RolloutBatch.concat(shards, renumber_groups=False)
    assert rows(back) == rows(batch)
    assert torch.equal(back.group_index, batch.group_index) and torch.equal(back.rewards, batch.rewards)
    assert back.extras == {"reward/timeouts": 2.0}  # counts are summed


def test_more_shards_than_groups_gives_empty_shards():
    batch = make_batch([1, 1], [1, 1], [5, 5])
    assert [len(s) for s in batch.shard(3)] == [2, 0, 0]


def test_concat_of_engine_results_renumbers_groups_and_pads_each_side():
    # two engines, each numbering its own groups from 0, with different prompt / response widths
    a = make_batch([2, 2], [3, 1], [0, 0], base=0)
    b = make_batch([4, 1, 1, 3], [1, 5, 2, 2], [0, 0, 1, 1], base=10)
    merged = RolloutBatch.concat([a, b])
    assert merged.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert merged.prompt_ids.shape == (6, 4) and merged.response_ids.shape == (6, 5)
    assert rows(merged) == rows(a) + rows(b)
    assert int(merged.prompt_ids[0, 0]) == PAD and not bool(merged.prompt_mask[0, 0])  # left padding
    assert int(merged.response_ids[0, 4]) == PAD and float(merged.rollout_logprobs[0, 4]) == 0.0


def test_concat_refuses_a_field_set_on_only_some_parts():
    a, b = make_batch([1], [1], [0]), make_batch([1], [1], [0], rewards=False)
    with pytest.raises(ValueError, match="'rewards' is set on some parts"):
        RolloutBatch.concat([a, b])


def test_metric_merge_rules():
    assert merge_rule("rollout/response_length_max") == "max"
    assert merge_rule("time/generate") == "max"
    assert merge_rule("rollout/num_response_tokens") == "sum"
    assert merge_rule("reward/timeouts") == "sum"
    merged = merge_metrics(
        [
            {"actor/entropy": 1.0, "x/num_tokens": 3, "x/len_max": 2, "time/gen": 1.5},
            {"actor/entropy": 4.0, "x/num_tokens": 5, "x/len_max": 9, "time/gen": 0.5},
        ],
        weights=[3.0, 1.0],
    )
    assert merged == {
        "actor/entropy": (1.0 * 3 + 4.0) / 4,
        "x/num_tokens": 8,
        "x/len_max": 9,
        "time/gen": 1.5,
    }
