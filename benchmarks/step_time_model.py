"""The rules behind benchmarks/overlap_prediction.py: a GRPO step's time at one placement of a recipe,
scaled from the phase times measured at another, and whether the placement fits in memory. Pure
arithmetic on a Config and the model's HF config (tested in tests/unit/test_overlap_prediction.py).
Each rule is an assumption, not a measurement:

- Rollout: decode is bound by memory bandwidth. A decoded token costs each GPU of its engine its share
  of the weight read (the engine's weights per GPU / its running batch) plus its context's MLA latent
  KV, which every TP rank holds and reads whole (one latent "head": SGLang without DP attention
  replicates it). The running batch is the engine's responses, at most as many full-length ones
  (prompt + response caps) as its KV pool holds (SGLang's share less its weights). Generate time
  scales with responses per engine x bytes per token, at the same share of the bandwidth bound;
  grading does not scale.
- Actor: logprobs + train scale with 1 / actor GPUs (the same tokens/s per GPU at any TP / EP).
- Weight sync: as measured (CUDA IPC) when colocated; x a factor over NCCL between GPU groups.
- Bound 0 runs the phases in series, plus the offload / onload where the actor offloads. Bound >= 1
  on GPUs of their own (rlinf/runners/pipeline.py): the rollout side and the actor side overlap, and
  the sync waits for the generate in flight, so a step is max(generate + grading, logprobs + train)
  + sync + other. Both resident on the same GPUs with a bound is not predicted (they contend).
- Memory: the per-GPU peak from rlinf/models/memory_plan.py at the placement's TP / EP / DP fits
  within FIT_SHARE of the GPU (the plan leaves out CUDA contexts, graphs and fragmentation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from benchmarks.decode_bounds import kv_bytes_per_token
from rlinf.models.memory_plan import DTYPE_BYTES, memory_plan, rank_params

FIT_SHARE = 0.9  # of the GPU; the rest for what the plan does not count (about 4-11 GiB measured)


@dataclass(frozen=True)
class Phases:
    """Seconds of one step, by the runner's timers (time/<name>)."""

    rollout: float
    reward: float
    logprobs: float
    train: float
    weight_sync: float
    offload_onload: float
    other: float

    @property
    def step(self) -> float:
        return sum(vars(self).values())


@dataclass(frozen=True)
class Prediction:
    rollout_side: float  # generate (scaled) + grading
    actor_side: float  # logprobs + train (scaled)
    serial: float  # weight sync + offload / onload + other: never overlapped
    step: float


def predict(
    ref: Phases, rollout_scale: float, actor_scale: float, sync_scale: float, offload: bool, bound: int
) -> Prediction:
    rollout = ref.rollout * rollout_scale + ref.reward
    actor = (ref.logprobs + ref.train) * actor_scale
    serial = ref.weight_sync * sync_scale + (ref.offload_onload if offload else 0.0) + ref.other
    sides = max(rollout, actor) if bound >= 1 else rollout + actor
    return Prediction(rollout, actor, serial, sides + serial)


@dataclass(frozen=True)
class Layout:
    """What one placement of the recipe runs, and what the memory plan says of it."""

    rollout_gpus: int
    actor_gpus: int
    colocated: bool
    engines: int
    rollout_tp: int
    actor_tp: int
    actor_ep: int
    actor_dp: int
    offload: bool
    bound: int
    decode_cost: float  # bytes each engine GPU reads per decoded token x responses per engine
    running_batch: int
    peak_rollout: float  # bytes on a rollout GPU (colocated: on every GPU, the same as peak_actor)
    peak_actor: float


def decode_context(cfg) -> float:
    """Assumed: prompts and responses average half their caps; a decode step's context averages the
    prompt plus half the response."""
    return (cfg.data.max_prompt_length + cfg.algorithm.sampling_params.max_new_tokens / 2) / 2


def layout(cfg, hf: dict, gpu_bytes: float) -> Layout:
    from rlinf.config.validate import actor_data_parallel_size, placement_of

    placement, m, r = placement_of(cfg), cfg.actor.model, cfg.rollout
    rollout_gpus, actor_gpus = len(placement.gpus["rollout"]), len(placement.gpus["actor"])
    tp = r.tensor_parallel_size
    engines = rollout_gpus // tp
    weights = DTYPE_BYTES[r.model.precision] * rank_params(hf, tp, tp if r.sglang.enable_ep_moe else 1).total
    engine_share = r.gpu_memory_utilization * gpu_bytes
    kv_token = kv_bytes_per_token(hf)
    full_length = cfg.data.max_prompt_length + cfg.algorithm.sampling_params.max_new_tokens
    responses = math.ceil(cfg.data.rollout_batch_size * cfg.algorithm.group_size / engines)
    batch = min(responses, int((engine_share - weights) // (full_length * kv_token)))
    decode_cost = responses * (weights / batch + decode_context(cfg) * kv_token) if batch > 0 else math.inf

    plan = memory_plan(cfg, hf, gpu_bytes)
    static = plan.static_actor
    offload = cfg.actor.offload_between_phases is True  # `auto` keeps the actor resident from step 2
    colocated = placement.is_colocated("actor", "rollout")
    if colocated:  # rollout beside the actor unless offloaded; training; the sync into resumed weights
        rollout_peak = actor_peak = max(
            engine_share + (0 if offload else static),
            static + plan.activations,
            static + weights + plan.export_peak,
        )
    else:
        rollout_peak, actor_peak = engine_share, static + max(plan.activations, plan.export_peak)
    return Layout(
        rollout_gpus=rollout_gpus,
        actor_gpus=actor_gpus,
        colocated=colocated,
        engines=engines,
        rollout_tp=tp,
        actor_tp=m.tensor_model_parallel_size,
        actor_ep=m.expert_model_parallel_size,
        actor_dp=actor_data_parallel_size(cfg),
        offload=offload,
        bound=cfg.runner.max_staleness,
        decode_cost=decode_cost,
        running_batch=batch,
        peak_rollout=rollout_peak,
        peak_actor=actor_peak,
    )


def predict_layout(ref: Phases, base: Layout, lay: Layout, nccl_sync_factor: float) -> Prediction:
    """`lay`'s step from `ref`, the phase seconds measured at `base`."""
    if lay.colocated and lay.bound >= 1:
        raise ValueError(
            "not predicted: with a bound, colocated roles run at once on the same GPUs and share their "
            "SMs and bandwidth (measure it: docs/rollout.md)"
        )
    return predict(
        ref,
        rollout_scale=lay.decode_cost / base.decode_cost,
        actor_scale=base.actor_gpus / lay.actor_gpus,
        sync_scale=1.0 if lay.colocated else nccl_sync_factor,
        offload=lay.offload,
        bound=lay.bound,
    )


def with_rollout_share(ref: Phases, share: float) -> Phases:
    """The step with its generate stretched (or shrunk) to `share` of it, the other phases kept."""
    rest = ref.step - ref.rollout
    return replace(ref, rollout=share * rest / (1 - share))


def fits(lay: Layout, gpu_bytes: float) -> bool:
    return lay.running_batch > 0 and max(lay.peak_rollout, lay.peak_actor) <= FIT_SHARE * gpu_bytes
