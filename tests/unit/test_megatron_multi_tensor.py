"""rlinf/models/megatron/multi_tensor.py: megatron-core's fallback grad norm and scale, on torch's
foreach kernels: the same values as a plain per-tensor computation, and no per-tensor host read."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from rlinf.models.megatron.multi_tensor import foreach_l2_norm, foreach_scale


def _grads():
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(shape, generator=g) * s
        for shape, s in (((7, 5), 1.0), ((3,), 30.0), ((0,), 1.0), ((4, 4), 1e-3))
    ]


def _scalar_reads(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")


def test_l2_norm_is_the_norm_of_all_elements_as_one_fp32_tensor():
    grads = _grads()
    norm, per_tensor = foreach_l2_norm(2048, torch.zeros(1, dtype=torch.int), [grads], False)
    expected = torch.cat([t.flatten().double() for t in grads]).norm()
    assert per_tensor is None
    assert norm.shape == (1,) and norm.dtype == torch.float32
    assert norm.item() == pytest.approx(expected.item(), rel=1e-6)


def test_l2_norm_of_bf16_grads_is_taken_in_fp32():
    grads = [torch.full((4096,), 0.01, dtype=torch.bfloat16)] * 3
    norm, _ = foreach_l2_norm(2048, None, [grads], False)
    exact = (3 * 4096 * torch.tensor(0.01, dtype=torch.bfloat16).double() ** 2).sqrt()
    assert norm.item() == pytest.approx(exact.item(), rel=1e-6)


def test_l2_norm_of_no_tensor_is_zero():
    assert foreach_l2_norm(2048, None, [[torch.zeros(0)]], False)[0].item() == 0.0


def test_norm_reads_nothing_back_to_the_host_per_tensor():
    grads = _grads() * 50  # 200 tensors
    per_tensor_reads = _scalar_reads(lambda: torch.tensor([torch.norm(t) for t in grads]))
    ours = _scalar_reads(lambda: foreach_l2_norm(2048, None, [grads], False))
    assert per_tensor_reads >= len(grads)  # what megatron's local fallback does
    assert ours == 0


def test_scale_in_place_and_into_another_dtype():
    grads = _grads()
    expected = [t * 0.25 for t in grads]
    foreach_scale(2048, None, [grads, grads], 0.25)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    src = _grads()
    dst = [torch.empty_like(t, dtype=torch.bfloat16) for t in src]
    foreach_scale(2048, None, [src, dst], 1.0)
    for got, want in zip(dst, src, strict=True):
        assert torch.equal(got, want.to(torch.bfloat16))
    foreach_scale(2048, None, [src, dst], 2.0)
    for got, want in zip(dst, src, strict=True):
        assert torch.equal(got, (want * 2.0).to(torch.bfloat16))
