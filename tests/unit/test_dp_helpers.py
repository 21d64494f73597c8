"""Pure pieces of the many-rank path: row slices, prompt shares, engine seeds, global counts, sizes."""

import torch

from rlinf.algorithms import LossNormalizer
from rlinf.config import load_config
from rlinf.scheduler.facades import contiguous_shares, engine_seed
from rlinf.scheduler.roles import group_sizes
from rlinf.workers.actor.policy_update import dp_slice, mean_over_minibatches


def test_dp_slices_cover_every_row_once_in_order():
    for rows, size in ((16, 2), (10, 3), (2, 4)):
        covered = [r for rank in range(size) for r in range(rows)[dp_slice(rows, rank, size)]]
        assert covered == list(range(rows))
        lengths = [len(range(rows)[dp_slice(rows, rank, size)]) for rank in range(size)]
        assert max(lengths) - min(lengths) <= 1


def test_prompt_shares_and_engine_seeds():
    assert contiguous_shares(list("abcde"), 2) == [["a", "b"], ["c", "d", "e"]]
    assert contiguous_shares(["a"], 3) == [[], [], ["a"]]
    assert engine_seed(123, 0) == 123  # one engine samples what it always did
    assert len({engine_seed(123, i) for i in range(8)}) == 8


def test_normaliser_counts_are_global_when_all_reduced():
    rank0 = [torch.tensor([[True, True, False], [False, False, False]])]  # 2 tokens, 1 sequence
    rank1 = [torch.tensor([[True, True, True]]), torch.tensor([[True, False, False]])]  # 4 tokens, 2 seqs
    local1 = LossNormalizer.from_masks(rank1)
    # what an all-reduce over the two ranks returns to each of them
    counts = {
        0: torch.tensor([2.0, 1.0], dtype=torch.float64),
        1: torch.tensor([4.0, 2.0], dtype=torch.float64),
    }
    for mine, other in ((rank0, 1), (rank1, 0)):
        normalizer = LossNormalizer.from_masks(mine, all_reduce_sum=lambda t, o=other: t + counts[o])
        assert normalizer == LossNormalizer(num_tokens=6.0, num_sequences=3.0)
    assert local1 == LossNormalizer(num_tokens=4.0, num_sequences=2.0)


def test_step_metrics_average_minibatches_and_max_maxima():
    merged = mean_over_minibatches(
        [{"actor/loss": 1.0, "actor/ratio_max": 2.0}, {"actor/loss": 3.0, "actor/ratio_max": 1.5}]
    )
    assert merged == {"actor/loss": 2.0, "actor/ratio_max": 2.0}


def test_group_sizes_follow_the_backends():
    moonlight = load_config("moonlight-16b-grpo-megatron")
    assert group_sizes(moonlight) == {"actor": 8, "rollout": 1, "reward": 1}  # TP=8 engine on 8 GPUs
    two_engines = load_config("moonlight-16b-grpo-megatron", ["rollout.tensor_parallel_size=4"])
    assert group_sizes(two_engines)["rollout"] == 2
