"""The sync-free sampler on CUDA (rlinf/workers/rollout/sglang_hooks.py): torch.multinomial reads
the device from the host, ours does not, and both draw the same tokens from the same generator
state at Moonlight's vocabulary and a decode batch of 256."""

from __future__ import annotations

import pytest
import torch

from rlinf.workers.rollout.sglang_hooks import sample_from_probs


@pytest.fixture
def probs(cuda) -> torch.Tensor:
    g = torch.Generator(device=cuda).manual_seed(0)
    return torch.softmax(torch.randn(256, 163840, device=cuda, generator=g) * 3, dim=-1)


def test_torch_multinomial_synchronises_and_ours_does_not(probs):
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            torch.multinomial(probs, 1)
        sample_from_probs(probs)  # raises on any device->host synchronisation
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_same_tokens_as_torch_multinomial_on_cuda(probs):
    for seed in range(3):
        torch.manual_seed(seed)
        reference = torch.multinomial(probs, 1).view(-1)
        torch.manual_seed(seed)
        assert torch.equal(sample_from_probs(probs).long(), reference)
