"""The Megatron actor's logprob kernels (rlinf.models.megatron.logprobs_triton) on the GPU, at
Moonlight's vocabulary (163,840 columns, bf16 logits): against the chunked torch path of the same
module and, on a few rows, a float64 full-vocabulary reference. Values and gradients, two
temperatures. Their speed: benchmarks/logprob_kernels.py."""

from __future__ import annotations

import pytest
import torch
from gpu_checks import record

from rlinf.models.megatron import logprobs

VOCAB, ROWS = 163_840, 1024


def logprobs_and_grad(logits, targets, weights, temperature, *, fused: bool, monkeypatch):
    if not fused:
        monkeypatch.setattr(logprobs, "_kernels", lambda flat: None)
    try:
        x = logits.clone().requires_grad_(True)
        lp, h = logprobs.vocab_parallel_logprobs(x, targets, temperature=temperature)
        ((lp * weights[0]).sum() + (h * weights[1]).sum()).backward()
    finally:
        monkeypatch.undo()
    return lp.detach(), h.detach(), x.grad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_kernels_equal_the_chunked_path_and_a_float64_reference(cuda, monkeypatch, temperature):
    g = torch.Generator(device=cuda).manual_seed(3)
    # peaked rows, as a trained model's: one large logit among noise
    logits = torch.randn(ROWS, VOCAB, device=cuda, generator=g) * 2
    logits[torch.arange(ROWS, device=cuda), torch.randint(0, VOCAB, (ROWS,), device=cuda, generator=g)] += 12
    logits = logits.bfloat16()
    targets = torch.randint(0, VOCAB, (ROWS,), device=cuda, generator=g)
    weights = torch.randn(2, ROWS, device=cuda, generator=g)
    assert logprobs._kernels(logits) is not None, "Triton should serve CUDA logits"

    fused = logprobs_and_grad(logits, targets, weights, temperature, fused=True, monkeypatch=monkeypatch)
    chunked = logprobs_and_grad(logits, targets, weights, temperature, fused=False, monkeypatch=monkeypatch)
    for got, want in zip(fused[:2], chunked[:2], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # both round an fp32 gradient to bf16: one bf16 step apart at most, beyond fp32's cancellation
    # where p is near 1 (the target column: g (1 - p)), which scales with the row's weights
    slack = 1e-6 * weights.abs().sum(0)[:, None] / temperature
    diff = (fused[2].float() - chunked[2].float()).abs()
    assert bool((diff <= chunked[2].float().abs() * 2**-7 + slack).all())

    few = slice(0, 16)
    x = logits[few].double().requires_grad_(True)
    logp = (x / temperature).log_softmax(-1)
    ref_lp = logp.gather(-1, targets[few, None]).squeeze(-1)
    ref_h = -(logp.exp() * logp).sum(-1)
    ((ref_lp * weights[0, few].double()).sum() + (ref_h * weights[1, few].double()).sum()).backward()
    torch.testing.assert_close(fused[0][few].double(), ref_lp.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused[1][few].double(), ref_h.detach(), rtol=1e-5, atol=1e-5)
    ref_grad = x.grad
    assert bool(((fused[2][few].double() - ref_grad).abs() <= ref_grad.abs() * 2**-7 + slack[few]).all())
    record(
        f"logprob kernels vs chunked torch path (T={temperature}, {ROWS} x {VOCAB} bf16)",
        logprob_max_diff=float((fused[0] - chunked[0]).abs().max()),
        entropy_max_diff=float((fused[1] - chunked[1]).abs().max()),
        grad_max_rel_diff=float((diff / chunked[2].float().abs().clamp_min(1e-30)).max()),
        logprob_vs_float64=float((fused[0][few].double() - ref_lp).abs().max()),
    )
