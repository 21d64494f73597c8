"""The precision-aware optimizer (fp32 masters, bf16 Adam moments) on one GPU, on whichever path
this machine runs: with Transformer Engine megatron-core's own (TE's FusedAdam, the fp32 masters
kept as the bf16 weights plus 16-bit remainders), without it rlinf's CompactAdamW inside
megatron-core's distributed optimizer:

- a short run with bf16 moments tracks the all-fp32-state run, measured as the CPU test of
  CompactAdamW measures it (tests/megatron_cpu/test_optimizer_precision.py): the fp32 master
  weights' update and the last loss stay closer to the fp32 run's than those of the same fp32 run
  with a 1% higher learning rate, a perturbation users would call the same run (bf16 weights make
  any perturbation grow); the 5% figure of earlier runs and a second fp32 run's distance (MoE
  scatter_add order without TE) are recorded beside it;
- on the Moonlight-shaped slice the moments take half the bytes, and offload (which moves every
  weight, grad and optimizer tensor off the GPU) frees 18 bytes per parameter with fp32 states and
  12 (TE: 2 weights + 4 grads + 2 master remainder + 2 + 2 moments) or 14 (TE-free: 4-byte masters)
  with bf16 moments.

Every run takes adam_beta2 0.95 (test_megatron_actor.actor_config): TE's FusedAdam rounds bf16
moments to nearest, which loses 0.999's decay (rlinf.config.megatron_settings.rounded_moment_problems).

Figures go to $RLINF_GPU_FIGURES. Run: bash tests/gpu/run_megatron_checks.sh optim
"""

from __future__ import annotations

import pytest
import torch
from gpu_checks import record
from test_megatron_actor import actor_config, free, synthetic_batch, vocab_of

from rlinf.workers.actor.base import with_logprobs

STEPS = 6


def inner_optimizers(actor) -> list:
    """The torch optimizers inside megatron's (chained) distributed optimizer."""
    from rlinf.models.megatron.adam_state import optimizer_parts

    return [part.optimizer for part in optimizer_parts(actor.optimizer)]


def master_weights(actor) -> list[torch.Tensor]:
    """The fp32 master shards the optimizer updates, copied to the CPU. TE's precision-aware FusedAdam
    updates the model's bf16 shards and keeps the masters in its state, whole or as 16-bit remainders."""
    return [
        fp32_master(p, inner.state.get(p, {})).cpu().clone()
        for inner in inner_optimizers(actor)
        for g in inner.param_groups
        for p in g["params"]
    ]


def fp32_master(param: torch.Tensor, state: dict) -> torch.Tensor:
    master = state.get("master_param")
    if master is None:
        return param.detach().float()
    if master.dtype != torch.int16:
        return master.detach().float()
    # bf16 weight = the master rounded to nearest, remainder = the master's low 16 bits: the high
    # half is the bf16 bits, one lower where the rounding went up (remainder's sign bit set).
    high = param.detach().view(torch.int16).to(torch.int32) - (master < 0).to(torch.int32)
    bits = (high << 16) | (master.to(torch.int32) & 0xFFFF)
    return bits.view(torch.float32)


def train_run(path, moments: str, *, steps: int = STEPS, precision: str = "bf16", lr: float = 2e-4):
    """(losses, master weights before, after, optimizer-state bytes) of `steps` GRPO minibatches."""
    from rlinf.workers.actor.megatron_actor import MegatronActor

    torch.manual_seed(0)
    actor = MegatronActor(actor_config(path, precision, lr=lr, moments=moments))
    # old logprobs from the starting policy, kept: the ratio moves and the clipped loss falls
    batch = synthetic_batch(vocab_of(path), seed=11, response=24)
    batch = with_logprobs(batch, [actor.compute_logprobs(batch)])
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
    lr_up = train_run(gpu_tiny, "fp32", lr=2e-4 * 1.01)
    distance, yardstick = update_distance(bf16, fp32), update_distance(lr_up, fp32)
    loss_gap, yardstick_loss_gap = abs(bf16[0][-1] - fp32[0][-1]), abs(lr_up[0][-1] - fp32[0][-1])
    record(
        "bf16 moments vs fp32 moments (GPU-tiny, bf16 weights, 6 steps, lr 2e-4)",
        update_distance_bf16_moments=distance,
        update_distance_fp32_lr_plus_1pct=yardstick,
        update_distance_fp32_rerun=update_distance(fp32_again, fp32),
        losses_fp32=fp32[0],
        losses_bf16_moments=bf16[0],
        losses_fp32_lr_plus_1pct=lr_up[0],
        last_loss_gap=[loss_gap, yardstick_loss_gap],
        moment_bytes=[fp32[3], bf16[3]],
    )
    assert bf16[3] * 2 == fp32[3]  # the moments take half the bytes
    assert fp32[0][-1] < fp32[0][0]  # the run trains
    assert 0 < distance < yardstick, (distance, yardstick)
    assert loss_gap < yardstick_loss_gap, (loss_gap, yardstick_loss_gap)


def test_bf16_moments_free_their_bytes_per_parameter_on_the_slice(megatron_installed, moonlight_slice):
    from rlinf.models.megatron import te_placeholder
    from rlinf.workers.actor.megatron_actor import MegatronActor

    saving_per_param = 6 if te_placeholder.real_te_available() else 4

    figures = {}
    for moments in ("fp32", "bf16"):
        actor = MegatronActor(actor_config(moonlight_slice, "bf16", lr=1e-6, moments=moments))
        params = sum(p.numel() for chunk in actor.model for p in chunk.parameters())
        batch = synthetic_batch(vocab_of(moonlight_slice), seed=12, response=24)
        torch.cuda.reset_peak_memory_stats()
        actor.train(batch, step=0, logprobs=actor.compute_logprobs(batch))
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
        spec="transformer_engine" if saving_per_param == 6 else "te_free",
        params=params,
        computed_gib={"fp32": params * 18 / 2**30, "bf16": params * (18 - saving_per_param) / 2**30},
        saved_gib=saved,
        computed_saving_gib=params * saving_per_param / 2**30,
        **figures,
    )
    assert saved == pytest.approx(params * saving_per_param / 2**30, rel=0.05)
    assert figures["bf16"]["peak_gib"] < figures["fp32"]["peak_gib"]
