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
