"""benchmarks/idle_gaps.py: each gap between kernels is put down to a host sync, a late launch, a
dependency on other work, or no launch at all, by the runtime call that launched the kernel ending
the gap; sources name the host ops around the sync or the launch, on the launching thread."""

import pytest

from benchmarks.idle_gaps import code_frame, idle_gaps


def kernel(name: str, ts: float, dur: float, correlation: int | None) -> dict:
    args = {} if correlation is None else {"correlation": correlation}
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": args}


def runtime(name: str, ts: float, dur: float, correlation: int | None = None, tid: int = 1) -> dict:
    args = {} if correlation is None else {"correlation": correlation}
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def op(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid}


EVENTS = [
    op("nn.Module: MoELayer", 0, 1000),
    # A runs 0..100; the host then reads a value back: .item() waits for it, launches B at 170
    runtime("cudaLaunchKernel", 0, 5, correlation=1),
    kernel("gemm_a", 0, 100, correlation=1),
    op("aten::item", 45, 115),
    runtime("cudaStreamSynchronize", 50, 45),  # returns at 95: 5 us before the GPU ran dry, clock skew
    op("aten::mm", 165, 15),
    runtime("cudaLaunchKernel", 170, 5, correlation=2),
    kernel("gemm_b", 200, 50, correlation=2),  # gap 100..200: host sync, 100 us
    # C was launched at 190, long before it ran: it waited on other work (gap 250..400)
    op("aten::add", 185, 10),
    runtime("cudaLaunchKernel", 190, 3, correlation=3),
    kernel("add_c", 400, 50, correlation=3),
    # another thread's sync returns inside the next gap: not the launching thread's
    runtime("cudaEventSynchronize", 455, 40, tid=2),
    op("aten::gelu", 495, 10),
    runtime("cudaLaunchKernel", 500, 5, correlation=4),
    kernel("gelu_d", 510, 90, correlation=4),  # gap 450..510: host launch, 60 us
    kernel("graph_node_e", 700, 10, correlation=None),  # gap 600..700: unlinked, 100 us
    runtime("cudaLaunchKernel", 711, 1, correlation=6),
    kernel("tiny_f", 713, 5, correlation=6),  # a 3 us gap, under the threshold
]


def test_each_gap_gets_its_cause_and_the_host_ops_around_it():
    s = idle_gaps(EVENTS, min_gap_us=5)
    assert s["span_ms"] == pytest.approx(0.718)
    assert s["gaps"] == 4
    assert s["idle_ms"] == pytest.approx(0.41)
    assert s["by_cause"] == {
        "host sync": {"ms": 0.1, "gaps": 1},
        "host launch": {"ms": 0.06, "gaps": 1},
        "dependency": {"ms": 0.15, "gaps": 1},
        "unlinked": {"ms": 0.1, "gaps": 1},
    }
    sources = {(t["cause"], t["source"]): t["ms"] for t in s["top_sources"]}
    assert sources == {
        ("dependency", "add_c"): 0.15,
        ("host sync", "cudaStreamSynchronize in aten::item < nn.Module: MoELayer"): 0.1,
        ("unlinked", "graph_node_e"): 0.1,
        ("host launch", "aten::gelu < nn.Module: MoELayer"): 0.06,
    }
    assert s["top_sources"][0]["source"] == "add_c"  # ranked by idle time


def test_threshold_and_overlapping_kernels():
    # the 3 us gap counts once the threshold is below it; a kernel on another stream that overlaps
    # its neighbour leaves no gap
    assert idle_gaps(EVENTS, min_gap_us=2)["by_cause"]["host launch"] == {"ms": 0.063, "gaps": 2}
    overlapping = [
        runtime("cudaLaunchKernel", 0, 1, correlation=1),
        kernel("a", 0, 100, correlation=1),
        runtime("cudaLaunchKernel", 1, 1, correlation=2),
        kernel("b", 50, 100, correlation=2),
        runtime("cudaLaunchKernel", 2, 1, correlation=3),
        kernel("c", 120, 10, correlation=3),  # inside b: no gap
        runtime("cudaLaunchKernel", 3, 1, correlation=4),
        kernel("d", 140, 20, correlation=4),  # after c but still inside b: no gap either
        runtime("cudaLaunchKernel", 4, 1, correlation=5),
        kernel("d_twin", 140, 20, correlation=5),  # same times on another stream
    ]
    assert idle_gaps(overlapping)["gaps"] == 0


def frame(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "tid": tid}


SITE = "/tmp/site/whl2/"
FRAMES = [
    frame(SITE + "megatron/core/transformer/moe/moe_layer.py(250): forward", 0, 1000),
    # the host sync gap: the host ran from the sync's return (the gap's start, 100) to the launch
    # (170); halfway, at 135, rlinf's metrics read is the innermost project frame (torch's is not)
    frame("/work/rlinf/workers/actor/policy_update.py(201): run_policy_update", 100, 66),
    frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py(1750): _call_impl", 120, 40),
    # the host launch gap 450..510 (launch at 500): at 475, TE's grouped linear on thread 1
    frame(SITE + "transformer_engine/pytorch/module/grouped_linear.py(88): forward", 460, 45),
    frame("/work/rlinf/models/megatron/logprobs.py(10): other_thread", 470, 10, tid=2),
]


def test_host_code_names_the_project_frame_the_host_ran_while_the_gpu_waited():
    s = idle_gaps(EVENTS + FRAMES, min_gap_us=5)
    assert s["host_code"] == [
        {"code": "rlinf/workers/actor/policy_update.py(201): run_policy_update", "ms": 0.1, "gaps": 1},
        {"code": "transformer_engine/pytorch/module/grouped_linear.py(88): forward", "ms": 0.06, "gaps": 1},
    ]  # the dependency and the unlinked gap are not the host's
    assert "host_code" not in idle_gaps(EVENTS)  # a trace without Python stacks


def test_frames_are_named_from_their_package_on():
    assert code_frame(SITE + "megatron/core/x.py(1): f") == "megatron/core/x.py(1): f"
    assert code_frame("rlinf/a.py(2): g") == "rlinf/a.py(2): g"
    assert code_frame("/opt/notrlinf/a.py(3): h") is None  # a package name only after a slash
    assert code_frame("ray/_private/worker.py(4): get") is None


def test_no_kernels_is_an_error():
    with pytest.raises(ValueError, match="no GPU kernel events"):
        idle_gaps([op("aten::mm", 0, 10)])
