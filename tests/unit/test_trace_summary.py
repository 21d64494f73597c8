"""benchmarks/trace_summary.py: GPU busy time is the union of kernel intervals, idle the rest of
the span, kernels ranked by their summed time, all scaled per step; a gzip trace reads the same."""

import gzip
import json

import pytest

from benchmarks.trace_summary import load_events, summarize


def kernel(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


EVENTS = [
    kernel("void gemm_bf16(int)", 0, 400),
    kernel("attention_decode", 300, 200),  # overlaps the gemm by 100 us on another stream
    kernel("gemm_bf16", 1000, 400),
    kernel("Memcpy DtoH", 1500, 100, cat="gpu_memcpy"),
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # host side: ignored
    {"ph": "i", "cat": "kernel", "name": "marker", "ts": 9000},  # not a duration event
]


def test_busy_idle_and_ranking_per_step():
    s = summarize(EVENTS, steps=2)
    # span 0..1600 us; busy = 500 (0..500) + 400 + 100 = 1000 us; per step in ms
    assert s["span"] == pytest.approx(0.8)
    assert s["gpu_busy"] == pytest.approx(0.5)
    assert s["gpu_idle"] == pytest.approx(0.3)
    assert s["gpu_busy_share"] == pytest.approx(1000 / 1600, abs=1e-4)
    assert s["kernels_launched"] == 4
    top = s["top_kernels"][0]
    assert (top["name"], top["calls"], top["time"]) == ("gemm_bf16", 2, pytest.approx(0.4))
    assert top["share_of_kernel_time"] == pytest.approx(800 / 1100, abs=1e-4)


def test_kernel_names_lose_return_type_and_arguments_not_their_identity():
    softmax = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, int)"
    copy = "void at::native::(anonymous namespace)::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
    names = [k["name"] for k in summarize([kernel(softmax, 0, 2), kernel(copy, 5, 1)])["top_kernels"]]
    assert names == ["at::native::cunn_SoftMaxForward<4, float>", "at::native::direct_copy_kernel_cuda"]


def test_gzip_trace_round_trip_and_no_kernels(tmp_path):
    path = tmp_path / "x-DECODE.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": EVENTS}, f)
    assert summarize(load_events(path)) == summarize(EVENTS)
    with pytest.raises(ValueError, match="no GPU kernel events"):
        summarize([e for e in EVENTS if e["cat"] == "cpu_op"])
