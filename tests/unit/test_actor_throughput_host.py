"""benchmarks/actor_throughput.py --profile-host: the host summary counts device->host syncs and names
the Python frames they come from (what makes a train call host-bound)."""

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.actor_throughput import host_summary


def _sync_five_times(x):
    for _ in range(5):
        (x @ x).sum().item()


def _sync_once(x):
    return x[0, 0].item()


def test_syncs_are_counted_by_their_python_call_site():
    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        _sync_five_times(x)
        _sync_once(x)
    summary = host_summary(prof)
    assert summary["syncs"]["aten::_local_scalar_dense"] == 6
    first, second = summary["sync_sources"][:2]
    assert first["calls"] == 5 and "_sync_five_times" in first["python"][0]
    assert second["calls"] == 1 and "_sync_once" in second["python"][0]
    assert any(op["op"] == "aten::mm" and op["calls"] == 5 for op in summary["top_host_ops_self_ms"])


def test_each_figure_is_its_median_over_the_runs_and_the_runs_are_kept():
    from benchmarks.actor_throughput import median_of_runs

    runs = [
        {"tokens_per_s": 40.0, "kernels": 5000, "profile_one_train_call": {"span": 1.0}},
        {"tokens_per_s": 10.0, "kernels": 5200, "profile_one_train_call": {"span": 2.0}},  # an outlier
        {"tokens_per_s": 42.0, "kernels": 5100, "profile_one_train_call": {"span": 3.0}},
    ]
    result = median_of_runs(runs)
    assert result["tokens_per_s"] == 40.0 and result["kernels"] == 5100
    assert result["runs"] == runs and "profile_one_train_call" not in result


def test_the_actors_train_with_the_recipes_optimizer_settings():
    from benchmarks.actor_throughput import recipe_optim

    optim = recipe_optim("moonlight-16b-grpo-megatron")
    assert optim.use_precision_aware_optimizer and optim.use_distributed_optimizer
    assert (optim.exp_avg_dtype, optim.exp_avg_sq_dtype) == ("fp32", "fp32")
    assert optim.lr == 1e-6 and optim.clip_grad == 1.0


def test_the_garbage_collectors_time_and_full_collections_are_counted_while_active():
    import gc

    from benchmarks._common import GcTime

    class Node:
        def __init__(self):
            self.me = self  # a cycle: only the cyclic collector frees it

    with GcTime() as collector:
        for _ in range(3):
            _ = [Node() for _ in range(20_000)]
            gc.collect()
    after = list(collector.collections)
    gc.collect()  # outside: not counted, and the callback is gone
    assert after[2] >= 3 and collector.collections == after and collector.seconds > 0
    assert collector._on not in gc.callbacks
