"""The Triton kernels of the vocab-parallel logprobs (rlinf.models.megatron.logprobs_triton), run by
Triton's CPU interpreter, against a full-vocabulary float64 reference: values and gradients, one
rank and two tensor-parallel ranks (gloo, two processes).

Triton comes with the CUDA build of torch that this suite's venv installs; the embedded suite's
CPU torch has none. The kernels run in spawned processes started with TRITON_INTERPRET=1, and a
small block makes every row span several blocks and a ragged tail.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("triton", reason="Triton comes with torch's CUDA build (the megatron-cpu venv)")

VOCAB, BLOCK = 300, 64


def reference(logits, targets, temperature):
    logp = (logits.double() / temperature).log_softmax(-1)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return picked, entropy


def inputs(seed=0, shape=(3, 5), vocab=VOCAB, rising=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, vocab, generator=g) * 3
    if rising:  # the running max grows in every block: each step rescales what came before
        logits = logits + torch.linspace(0, 40, vocab)
    targets = torch.randint(0, vocab, shape, generator=g)
    return logits, targets, torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def run(logits, targets, w_lp, w_h, temperature, *, use=("logprobs", "entropy"), **kw):
    from rlinf.models.megatron.logprobs import vocab_parallel_logprobs

    x = logits.detach().requires_grad_(True)  # a leaf with the logits' strides
    lp, h = vocab_parallel_logprobs(x, targets, temperature=temperature, **kw)
    if "sums" in use:  # the gradients arrive as expanded scalars (stride 0)
        (lp.sum() + h.sum()).backward()
        return lp, h, x.grad
    loss = (lp * w_lp).sum() if "logprobs" in use else (lp.detach() * w_lp).sum()
    loss = loss + ((h * w_h).sum() if "entropy" in use else (h.detach() * w_h).sum())
    loss.backward()
    return lp, h, x.grad


def reference_run(logits, targets, w_lp, w_h, temperature, *, use=("logprobs", "entropy")):
    x = logits.double().clone().requires_grad_(True)
    lp, h = reference(x, targets, temperature if temperature > 0 else 1.0)
    if "sums" in use:
        (lp.sum() + h.sum()).backward()
        return lp.detach(), h.detach(), x.grad
    loss = (lp * w_lp.double()).sum() if "logprobs" in use else 0
    loss = loss + ((h * w_h.double()).sum() if "entropy" in use else 0)
    loss.backward()
    return lp.detach(), h.detach(), x.grad


def close(got, want, tol=1e-5):
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


# (name, seed, rising, temperature, outputs the loss uses, dtype, row stride 2 V)
CASES = [
    *[
        (f"t{t}-{'rising' if rising else 'random'}", 1, rising, t, ("logprobs", "entropy"), "float32", False)
        for t in (1.0, 0.7, 0.0)
        for rising in (False, True)
    ],
    ("logprobs-only", 3, False, 0.7, ("logprobs",), "float32", False),
    ("entropy-only", 3, False, 0.7, ("entropy",), "float32", False),
    ("plain-sums", 6, False, 1.0, ("sums",), "float32", False),
    ("bf16", 4, False, 1.0, ("logprobs", "entropy"), "bfloat16", False),
    ("strided", 5, False, 0.9, ("logprobs", "entropy"), "float32", True),
]


def case_inputs(seed, rising, dtype, strided):
    logits, targets, w_lp, w_h = inputs(seed=seed, rising=rising)
    logits = logits.to(getattr(torch, dtype))
    if strided:  # rows 2 V apart in memory
        logits = torch.cat([logits, torch.full_like(logits, 50.0)], -1)[..., :VOCAB]
        assert logits.stride(-2) == 2 * VOCAB
    return logits, targets, w_lp, w_h


def interpreted_kernels():
    """The kernels of a process started with TRITON_INTERPRET=1, counting their calls, with
    BLOCK-column steps."""
    import rlinf.models.megatron.logprobs_triton as kernels

    assert os.environ.get("TRITON_INTERPRET") == "1"
    kernels.BLOCK = BLOCK
    calls: list[str] = []
    for name in ("slice_stats", "slice_grad"):
        real = getattr(kernels, name)
        setattr(kernels, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    return calls


def _cases_worker(rank, out_dir):
    calls = interpreted_kernels()
    results = {}
    for name, seed, rising, t, use, dtype, strided in CASES:
        calls.clear()
        lp, h, grad = run(*case_inputs(seed, rising, dtype, strided), t, use=use)
        results[name] = {"lp": lp.detach(), "h": h.detach(), "grad": grad, "calls": list(calls)}
    torch.save(results, os.path.join(out_dir, "cases.pt"))


def spawn(fn, nprocs, *args):
    """`fn` in `nprocs` fresh processes whose Triton interprets its kernels on the CPU (Triton reads
    TRITON_INTERPRET when it is imported, so this process's own import cannot serve)."""
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        mp.spawn(fn, args=args, nprocs=nprocs, join=True)
    finally:
        del os.environ["TRITON_INTERPRET"]


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    out = tmp_path_factory.mktemp("fused")
    spawn(_cases_worker, 1, str(out))
    return torch.load(out / "cases.pt")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernels_give_the_full_vocab_values_and_gradients(fused, case):
    name, seed, rising, t, use, dtype, strided = case
    got = fused[name]
    assert got["calls"] == ["slice_stats", "slice_grad"]  # the kernels ran, not the chunked path
    logits, targets, w_lp, w_h = case_inputs(seed, rising, dtype, False)
    want_lp, want_h, want_grad = reference_run(logits.float(), targets, w_lp, w_h, t, use=use)
    close(got["lp"], want_lp)
    close(got["h"], want_h)
    assert got["grad"].dtype == logits.dtype
    if dtype == "bfloat16":  # the fp32 gradient in bf16: within one bf16 step (Triton's interpreter
        # truncates to bf16 where the GPU rounds to nearest)
        assert bool(((got["grad"].double() - want_grad).abs() <= want_grad.abs() * 2**-7 + 1e-7).all())
    else:
        close(got["grad"], want_grad)


def _tp_worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    calls = interpreted_kernels()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    logits, targets, w_lp, w_h = inputs(seed=2)
    local = logits.chunk(world, -1)[rank]
    lp, h, grad = run(
        local, targets, w_lp, w_h, 0.8, vocab_start=rank * local.shape[-1], group=dist.group.WORLD
    )
    torch.save(
        {"lp": lp.detach(), "h": h.detach(), "grad": grad, "calls": calls},
        os.path.join(out_dir, f"{rank}.pt"),
    )
    dist.destroy_process_group()


def test_two_tensor_parallel_ranks_give_the_full_vocab_result(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spawn(_tp_worker, 2, 2, port, str(tmp_path))
    want_lp, want_h, want_grad = reference_run(*inputs(seed=2), 0.8)
    parts = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    for part in parts:  # every rank reports the full-vocabulary values
        assert part["calls"] == ["slice_stats", "slice_grad"]
        close(part["lp"], want_lp)
        close(part["h"], want_h)
    close(torch.cat([p["grad"] for p in parts], -1), want_grad)
