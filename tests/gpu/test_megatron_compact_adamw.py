"""The precision-aware optimizer without Transformer Engine (fp32 masters, bf16 Adam moments in
rlinf's CompactAdamW inside megatron-core's distributed optimizer), on one GPU:

- a short run with bf16 moments tracks the all-fp32-state run: the master weights' update differs
  from it by under 5%, or by at most 3x what a second fp32 run differs from the first (MoE
  scatter_add order makes two fp32 runs differ too); the losses are recorded side by side;
- on the Moonlight-shaped slice the moments take half the bytes, and offload (which moves every
  weight, grad and optimizer tensor off the GPU) frees 4 bytes per parameter less than with fp32
  moments: 14 instead of 18.

Figures go to $RLINF_GPU_FIGURES. Run: bash tests/gpu/run_megatron_checks.sh optim
"""

from __future__ import annotations

import pytest
import torch
from gpu_checks import record
from test_megatron_actor import actor_config, free, synthetic_batch, vocab_of

STEPS = 6


def inner_optimizers(actor) -> list:
    """The torch optimizers inside megatron's (chained) distributed optimizer."""
    from rlinf.models.megatron.adam_state import optimizer_parts

    return [part.optimizer for part in optimizer_parts(actor.optimizer)]


def master_weights(actor) -> list[torch.Tensor]:
    """The fp32 master shards the optimizer updates, copied to the CPU."""
    return [
        p.detach().cpu().clone()
        for inner in inner_optimizers(actor)
        for g in inner.param_groups
        for p in g["params"]
    ]


def train_run(path, moments: str, *, steps: int = STEPS, precision: str = "bf16"):
    """(losses, master weights before, after, optimizer-state bytes) of `steps` GRPO minibatches."""
    from rlinf.workers.actor.megatron_actor import MegatronActor

    torch.manual_seed(0)
    actor = MegatronActor(actor_config(path, precision, lr=2e-4, moments=moments))
    # old logprobs from the starting policy, kept: the ratio moves and the clipped loss falls
    batch = actor.compute_logprobs(synthetic_batch(vocab_of(path), seed=11, response=24))
    losses = []
    before = None
    for step in range(steps):
        metrics = actor.train(batch, step=step)
        if before is None:  # the masters after step 0 (the optimizer state exists from here on)
            before = master_weights(actor)
        losses.append(metrics["actor/loss"])
    after = master_weights(actor)
    state_bytes = sum(
        s.numel() * s.element_size()
        for inner in inner_optimizers(actor)
        for state in inner.state.values()
        for k, s in state.items()
        if k in ("exp_avg", "exp_avg_sq")
    )
    del actor
    free()
    return losses, before, after, state_bytes


def update_distance(run, reference) -> float:
    """|| update - reference update || / || reference update || over all master weights."""
    num = den = 0.0
    for b, a, rb, ra in zip(run[1], run[2], reference[1], reference[2], strict=True):
        num += ((a - b) - (ra - rb)).double().pow(2).sum().item()
        den += (ra - rb).double().pow(2).sum().item()
    return (num / den) ** 0.5


def test_bf16_moments_track_the_fp32_state_run(megatron_installed, gpu_tiny):
    fp32 = train_run(gpu_tiny, "fp32")
    fp32_again = train_run(gpu_tiny, "fp32")
    bf16 = train_run(gpu_tiny, "bf16")
    noise = update_distance(fp32_again, fp32)
    distance = update_distance(bf16, fp32)
    loss_gap = max(abs(a - b) for a, b in zip(bf16[0], fp32[0], strict=True))
    record(
        "bf16 moments vs fp32 moments (GPU-tiny, bf16 weights, 6 steps, lr 2e-4)",
        update_distance_bf16_moments=distance,
        update_distance_fp32_rerun=noise,
        losses_fp32=fp32[0],
        losses_bf16_moments=bf16[0],
        max_loss_gap=loss_gap,
        moment_bytes=[fp32[3], bf16[3]],
    )
    assert bf16[3] * 2 == fp32[3]  # the moments take half the bytes
    assert fp32[0][-1] < fp32[0][0]  # the run trains
    assert distance < max(0.05, 3 * noise), (distance, noise)


def test_bf16_moments_free_four_bytes_per_parameter_on_the_slice(megatron_installed, moonlight_slice):
    from rlinf.workers.actor.megatron_actor import MegatronActor

    figures = {}
    for moments in ("fp32", "bf16"):
        actor = MegatronActor(actor_config(moonlight_slice, "bf16", lr=1e-6, moments=moments))
        params = sum(p.numel() for chunk in actor.model for p in chunk.parameters())
        batch = synthetic_batch(vocab_of(moonlight_slice), seed=12, response=24)
        torch.cuda.reset_peak_memory_stats()
        actor.train(actor.compute_logprobs(batch), step=0)
        torch.cuda.synchronize()
        figures[moments] = {
            "allocated_gib": torch.cuda.memory_allocated() / 2**30,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "offload_freed_gib": actor.offload()["actor/offload_freed_gib"],
        }
        del actor
        free()
    saved = figures["fp32"]["offload_freed_gib"] - figures["bf16"]["offload_freed_gib"]
    record(
        "optimizer memory on the slice: fp32 vs bf16 moments (bf16 weights, fp32 masters and grads)",
        params=params,
        computed_gib={"fp32": params * 18 / 2**30, "bf16": params * 14 / 2**30},
        saved_gib=saved,
        computed_saving_gib=params * 4 / 2**30,
        **figures,
    )
    assert saved == pytest.approx(params * 4 / 2**30, rel=0.05)
    assert figures["bf16"]["peak_gib"] < figures["fp32"]["peak_gib"]
