"""The rollout facade drives several engines, each on its share of the prompts."""

import pytest
import torch

from rlinf.models.hf_checkpoint import load_tokenizer
from rlinf.runners.data_setup import build_datasets
from rlinf.scheduler.facades import RolloutGroup, engine_seed
from rlinf.scheduler.worker_group import WorkerGroup
from rlinf.workers.backends import ROLLOUT_BACKENDS
from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.torch_rollout import TorchRollout
from tests.integration.conftest import small_config

pytestmark = pytest.mark.slow


def responses(batch) -> list[tuple[int, ...]]:
    return [
        tuple(ids[mask].tolist()) for ids, mask in zip(batch.response_ids, batch.response_mask, strict=True)
    ]


def test_two_engines_split_the_prompts_and_their_groups_never_collide(
    random_tiny_checkpoint, tmp_path, ray_session
):
    cfg = small_config(random_tiny_checkpoint, tmp_path)
    train, _, _ = build_datasets(cfg, load_tokenizer(str(random_tiny_checkpoint)))
    prompts, params = list(train)[:5], SamplingParams.from_config(cfg.algorithm.sampling_params)
    group = WorkerGroup("rollout", ROLLOUT_BACKENDS["torch"], (cfg,), num_workers=2)
    try:
        merged = RolloutGroup(group).generate(prompts, 2, params, seed=5)
    finally:
        group.kill()
    # engine 0 took prompts 0-1 with the step's seed, engine 1 prompts 2-4 with its own seed
    local = TorchRollout(cfg)
    first, second = (
        local.generate(prompts[:2], 2, params, 5),
        local.generate(prompts[2:], 2, params, engine_seed(5, 1)),
    )
    assert responses(merged) == responses(first) + responses(second)
    assert merged.group_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert merged.solutions == [item.solutions for item in prompts for _ in range(2)]
    assert torch.equal(merged.rollout_logprobs[:4, : first.rollout_logprobs.shape[1]], first.rollout_logprobs)


def test_two_engines_each_keep_their_share_of_the_groups(random_tiny_checkpoint, tmp_path, ray_session):
    # data.oversample_prompts: 6 prompts drawn, 4 groups kept, 2 per engine (quota_shares)
    cfg = small_config(random_tiny_checkpoint, tmp_path)
    train, _, _ = build_datasets(cfg, load_tokenizer(str(random_tiny_checkpoint)))
    prompts, params = list(train)[:6], SamplingParams.from_config(cfg.algorithm.sampling_params)
    group = WorkerGroup("rollout", ROLLOUT_BACKENDS["torch"], (cfg,), num_workers=2)
    try:
        merged = RolloutGroup(group).generate(prompts, 2, params, seed=5, keep_groups=4)
    finally:
        group.kill()
    local = TorchRollout(cfg)
    first = local.generate(prompts[:3], 2, params, 5, keep_groups=2)
    second = local.generate(prompts[3:], 2, params, engine_seed(5, 1), keep_groups=2)
    assert len(first) == len(second) == 4 and set(first.finish_reasons) <= {"stop", "length"}
    assert responses(merged) == responses(first) + responses(second)
    assert merged.group_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert merged.solutions == first.solutions + second.solutions


def test_two_engines_share_the_carried_groups_of_a_partial_rollout(
    random_tiny_checkpoint, tmp_path, ray_session
):
    # data.partial_rollout: groups are dealt out in turn (0, 2, 4 to engine 0; 1, 3, 5 to engine 1),
    # each engine keeps its share of 4 and returns the rest to carry
    from rlinf.workers.rollout.partial import GroupInFlight

    cfg = small_config(random_tiny_checkpoint, tmp_path)
    train, _, _ = build_datasets(cfg, load_tokenizer(str(random_tiny_checkpoint)))
    groups = [GroupInFlight.fresh(item, 2) for item in list(train)[:6]]
    params = SamplingParams.from_config(cfg.algorithm.sampling_params)
    group = WorkerGroup("rollout", ROLLOUT_BACKENDS["torch"], (cfg,), num_workers=2)
    try:
        merged = RolloutGroup(group).generate_partial(groups, params, seed=5, keep_groups=4)
    finally:
        group.kill()
    local = TorchRollout(cfg)
    first = local.generate_partial(groups[0::2], params, 5, keep_groups=2)
    second = local.generate_partial(groups[1::2], params, engine_seed(5, 1), keep_groups=2)
    assert responses(merged.batch) == responses(first.batch) + responses(second.batch)
    assert merged.batch.group_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert merged.carried == first.carried + second.carried and len(merged.carried) == 2
