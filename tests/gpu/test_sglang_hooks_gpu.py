"""The sampler of rlinf's SGLang plugin on CUDA (rlinf/workers/rollout/sglang_hooks.py): it never
waits for the GPU, and it draws torch.multinomial's tokens from the same generator state at
Moonlight's vocabulary and a decode batch of 256."""

from __future__ import annotations

import pytest
import torch

from rlinf.workers.rollout.sglang_hooks import sample_from_probs


@pytest.fixture
def probs(cuda) -> torch.Tensor:
    g = torch.Generator(device=cuda).manual_seed(0)
    return torch.softmax(torch.randn(256, 163840, device=cuda, generator=g) * 3, dim=-1)


def test_returns_while_the_gpu_is_still_busy(probs):
    """No host read: with a long kernel queued ahead, the call returns before the GPU is done."""
    sample_from_probs(probs)  # first calls load kernels (CUDA lazy loading), which synchronises
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU clock cycles (the count must fit in 31 bits)
    tokens = sample_from_probs(probs)
    assert not torch.cuda.current_stream().query(), "the sampler waited for the GPU"
    torch.cuda.synchronize()
    assert tokens.shape == (256,)


def test_same_tokens_as_torch_multinomial_on_cuda(probs):
    for seed in range(3):
        torch.manual_seed(seed)
        reference = torch.multinomial(probs, 1).view(-1)
        torch.manual_seed(seed)
        assert torch.equal(sample_from_probs(probs).long(), reference)
