"""rlinf's foreach grad-norm and scale ops inside megatron-core's own clipping code
(rlinf/models/megatron/multi_tensor.py): installed only over megatron's local fallbacks, and giving
the fallbacks' numbers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs megatron-core 0.19 (Python >= 3.12)")

from cuda_on_cpu import cuda_on_cpu  # noqa: E402


def _params():
    g = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((8, 4), (5,), (3, 3, 3))]
    for i, p in enumerate(params):
        p.grad = torch.randn(p.shape, generator=g) * (10.0**i)
    return params


def test_install_replaces_megatrons_fallbacks_and_keeps_its_numbers(model_parallel, monkeypatch):
    from megatron.core import parallel_state, utils
    from megatron.core.optimizer import clip_grads, optimizer

    from rlinf.models.megatron import multi_tensor

    fallbacks = {
        "l2_norm_impl": utils.local_multi_tensor_l2_norm,
        "multi_tensor_scale_impl": utils.local_multi_tensor_scale,
    }
    for module in (clip_grads, optimizer):  # an actor built earlier in this process installed ours
        for name, fallback in fallbacks.items():
            if getattr(getattr(module, name, None), "__module__", "") == multi_tensor.__name__:
                monkeypatch.setattr(module, name, fallback)
    if clip_grads.l2_norm_impl is not utils.local_multi_tensor_l2_norm:
        pytest.skip("megatron-core found TE or apex here: nothing to replace")
    group = parallel_state.get_model_parallel_group()
    with cuda_on_cpu():
        reference = _params()
        ref_norm = clip_grads.get_grad_norm_fp32([p.grad for p in reference], grad_stats_parallel_group=group)
        clip_grads.clip_grad_by_total_norm_fp32(reference, 1.0, ref_norm)

        for module in (clip_grads, optimizer):  # undone after the test
            for name in ("l2_norm_impl", "multi_tensor_scale_impl"):
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, getattr(module, name))
        replaced = multi_tensor.install()
        assert set(replaced) == {
            "megatron.core.optimizer.clip_grads.l2_norm_impl",
            "megatron.core.optimizer.clip_grads.multi_tensor_scale_impl",
            "megatron.core.optimizer.optimizer.multi_tensor_scale_impl",
        }
        assert multi_tensor.install() == []  # a second call finds nothing of megatron's left

        ours = _params()
        norm = clip_grads.get_grad_norm_fp32([p.grad for p in ours], grad_stats_parallel_group=group)
        clip_grads.clip_grad_by_total_norm_fp32(ours, 1.0, norm)
    assert norm == pytest.approx(ref_norm, rel=1e-6)
    assert norm > 100  # the clip below really scales
    for got, want in zip(ours, reference, strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-6, atol=0)
