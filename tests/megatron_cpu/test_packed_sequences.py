"""`actor.pack_sequences` on the Megatron actor: one THD row of the micro-batch's real tokens
(megatron's PackedSeqParams, the TE-free attention one SDPA call per sequence) against the padded
forward, in megatron-core on the CPU (fp32, one gloo rank; tests/megatron_cpu/cuda_on_cpu.py):
logprobs, entropy and every weight's gradient equal; sequence parallelism's tail padding is a
sequence of its own; a response with a gap is refused.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

REASON = "needs megatron-core 0.19 and megatron-bridge 0.6 (bash requirements/install.sh agentic ...)"
pytest.importorskip("megatron.core", reason=REASON)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip(REASON, allow_module_level=True)

from actor_on_cpu import build_actor, varied_batch  # noqa: E402

from rlinf.data.batch import RolloutBatch  # noqa: E402


def logprobs_and_grads(actor, batch: RolloutBatch):
    model = actor.model[0]
    model.zero_grad_buffer()
    logprobs, entropy = actor._logprobs(model, batch)
    weights = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1))
    ((logprobs * weights).sum() + entropy.sum()).backward()
    model.finish_grad_sync()
    grads = {n: p.main_grad.clone() for n, p in model.named_parameters()}
    return logprobs.detach(), entropy.detach(), grads


def test_packed_logprobs_entropy_and_grads_equal_the_padded_forward(on_cpu, tiny_megatron_checkpoint):
    batch = varied_batch()
    results = {}
    for packed in (False, True):
        actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32", pack_sequences=packed)
        assert actor.cfg.actor.pack_sequences is packed
        results[packed] = logprobs_and_grads(actor, batch)
    (lp, ent, grads), (packed_lp, packed_ent, packed_grads) = results[False], results[True]
    mask = batch.response_mask
    assert (lp[~mask] == 0).all() and (packed_lp[~mask] == 0).all()
    assert lp[mask].abs().min() > 0
    torch.testing.assert_close(packed_lp, lp, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(packed_ent, ent, atol=2e-5, rtol=1e-5)
    assert packed_grads.keys() == grads.keys()
    for name, grad in grads.items():
        scale = grad.abs().max().item()
        assert scale > 0, name
        assert (packed_grads[name] - grad).abs().max().item() <= 1e-5 * scale + 1e-7, name


def test_packing_pads_the_row_with_a_sequence_of_its_own_under_sequence_parallelism(
    on_cpu, tiny_megatron_checkpoint
):
    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32", pack_sequences=True)
    batch = varied_batch()
    real = int(batch.prompt_mask.sum() + batch.response_mask.sum())
    tokens, positions, params, index = actor._packed_thd(batch)
    assert tokens.shape == positions.shape == (1, real)
    assert params.cu_seqlens_q.tolist()[-1] == real and params.qkv_format == "thd"
    assert index.numel() == int(batch.response_mask.sum())
    actor.tp_size, actor.cfg.actor.model.__dict__["sequence_parallel"] = 4, True  # frozen dataclass
    tokens, positions, params, _ = actor._packed_thd(batch)
    bounds = params.cu_seqlens_q.tolist()
    assert tokens.shape[1] % 4 == 0 and bounds[-1] == tokens.shape[1] > real and bounds[-2] == real
    assert positions[0, real:].tolist() == list(range(tokens.shape[1] - real))


def test_a_response_with_a_gap_is_refused(on_cpu, tiny_megatron_checkpoint):
    actor = build_actor(tiny_megatron_checkpoint, "fp32", precision="fp32", pack_sequences=True)
    batch = varied_batch()
    batch.response_mask[0, 3] = False
    with pytest.raises(ValueError, match="no gaps"):
        actor._packed_thd(batch)
