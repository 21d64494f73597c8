"""actor.num_workers: the torch actor's data-parallel size, validated before any worker starts."""

import pytest

from rlinf.config import ConfigError, load_config
from rlinf.config.validate import actor_data_parallel_size
from rlinf.scheduler.roles import group_sizes


def test_num_workers_is_the_torch_data_parallel_size_and_the_group_size():
    cfg = load_config("tiny-moe-grpo-cpu", ["actor.num_workers=2"])
    assert actor_data_parallel_size(cfg) == 2
    assert group_sizes(cfg) == {"actor": 2, "rollout": 1, "reward": 1}


def test_a_minibatch_that_does_not_split_over_the_workers_is_refused():
    with pytest.raises(
        ConfigError, match=r"actor.global_batch_size: 64 does not split over the 3 data-parallel"
    ):
        load_config("tiny-moe-grpo-cpu", ["actor.num_workers=3"])
    with pytest.raises(ConfigError, match=r"actor.num_workers: 0 is out of range"):
        load_config("tiny-moe-grpo-cpu", ["actor.num_workers=0"])


def test_torch_workers_on_gpus_need_one_gpu_each():
    gpus = ["cluster.num_gpus_per_node=1", "actor.num_workers=2", "actor.micro_batch_size=4"]
    with pytest.raises(
        ConfigError, match=r"actor.num_workers: 2 torch actor worker\(s\) need one GPU each but 1"
    ):
        load_config("tiny-moe-grpo-cpu", gpus)
