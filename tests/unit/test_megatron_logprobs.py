"""Vocab-parallel tempered logprobs + entropy against a full-vocabulary reference (CPU, gloo for TP=2)."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlinf.models.megatron import logprobs as vp


def reference(logits, targets, temperature):
    logp = (logits.double() / temperature).log_softmax(-1)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return picked, entropy


def _inputs(seed=0, shape=(3, 5), vocab=37):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, vocab, generator=g) * 3
    targets = torch.randint(0, vocab, shape, generator=g)
    w_lp = torch.randn(shape, generator=g)
    w_h = torch.randn(shape, generator=g)
    return logits, targets, w_lp, w_h


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_values_and_gradients_match_full_vocab(temperature, monkeypatch):
    monkeypatch.setattr(vp, "CHUNK_BYTES", 4 * 37 * 4)  # several chunks of 4 positions
    logits, targets, w_lp, w_h = _inputs()
    t = temperature if temperature > 0 else 1.0
    x = logits.clone().requires_grad_(True)
    lp, h = vp.vocab_parallel_logprobs(x, targets, temperature=temperature)
    ((lp * w_lp).sum() + (h * w_h).sum()).backward()
    ref_x = logits.double().clone().requires_grad_(True)
    ref_lp, ref_h = reference(ref_x, targets, t)
    ((ref_lp * w_lp.double()).sum() + (ref_h * w_h.double()).sum()).backward()
    torch.testing.assert_close(lp.double(), ref_lp.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h.double(), ref_h.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad.double(), ref_x.grad, atol=1e-5, rtol=1e-5)
    assert torch.equal(x.detach(), logits)  # fp32 logits are worked on in copies, never in place


@pytest.mark.parametrize("used", ["logprobs", "entropy"])
def test_an_output_the_loss_leaves_out_gives_the_gradient_of_the_other_alone(used, monkeypatch):
    """The actor detaches the entropy when it is only a metric (and a loss could use the entropy
    alone): the gradient is that of the used output, as in the full-vocabulary reference."""
    monkeypatch.setattr(vp, "CHUNK_BYTES", 4 * 37 * 4)
    logits, targets, w_lp, w_h = _inputs(seed=3)
    x = logits.clone().requires_grad_(True)
    lp, h = vp.vocab_parallel_logprobs(x, targets, temperature=0.7)
    ref_x = logits.double().clone().requires_grad_(True)
    ref_lp, ref_h = reference(ref_x, targets, 0.7)
    if used == "logprobs":
        ((lp * w_lp).sum() + (h.detach() * w_h).sum()).backward()
        (ref_lp * w_lp.double()).sum().backward()
    else:
        (h * w_h).sum().backward()
        (ref_h * w_h.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), ref_x.grad, atol=1e-5, rtol=1e-5)


def test_bf16_logits_keep_their_dtype_for_the_gradient():
    logits, targets, w_lp, _ = _inputs(seed=1)
    x = logits.bfloat16().requires_grad_(True)
    lp, _ = vp.vocab_parallel_logprobs(x, targets)
    (lp * w_lp).sum().backward()
    assert lp.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    ref_lp, _ = reference(x.detach().float(), targets, 1.0)
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-5, rtol=1e-5)


def _tp_worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    logits, targets, w_lp, w_h = _inputs(seed=2, vocab=40)
    local = logits.chunk(world, -1)[rank].clone().requires_grad_(True)
    lp, h = vp.vocab_parallel_logprobs(
        local, targets, temperature=0.8, vocab_start=rank * local.shape[-1], group=dist.group.WORLD
    )
    ((lp * w_lp).sum() + (h * w_h).sum()).backward()
    torch.save({"lp": lp.detach(), "h": h.detach(), "grad": local.grad}, os.path.join(out_dir, f"{rank}.pt"))
    dist.destroy_process_group()


def test_two_tensor_parallel_ranks_equal_the_full_vocab_result(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_tp_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    logits, targets, w_lp, w_h = _inputs(seed=2, vocab=40)
    ref_x = logits.double().clone().requires_grad_(True)
    ref_lp, ref_h = reference(ref_x, targets, 0.8)
    ((ref_lp * w_lp.double()).sum() + (ref_h * w_h.double()).sum()).backward()
    parts = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    for part in parts:  # every TP rank reports the full-vocabulary values
        torch.testing.assert_close(part["lp"].double(), ref_lp.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(part["h"].double(), ref_h.detach(), atol=1e-5, rtol=1e-5)
    grad = torch.cat([p["grad"] for p in parts], -1)
    torch.testing.assert_close(grad.double(), ref_x.grad, atol=1e-5, rtol=1e-5)
