"""Several processes (gloo, CPU), each running the real MegatronActor at one parallel layout.

`run_layout(layout, checkpoint, workdir, phase)` spawns `layout.world` processes. Each builds
`MegatronActor(cfg, rank, world, device="cpu")` under cuda_on_cpu (megatron-core's CUDA calls on
the CPU) and runs one phase on the same batch (`grpo_batch`):

- "train": every rank's largest differences between the actor's response-rows LM head and the
  full-vocabulary one (full_vocab.py), padded and packed; the export before training, logprobs and entropy of every row, the gradient of one GRPO
  minibatch (caught where the actor clips it: after megatron's grad reduction, before the optimizer
  step) exported to full HF-named tensors, the exported weights after that update, a dist
  checkpoint, then a second update and its exported weights;
- "resume": a fresh actor loads that checkpoint and makes the second update again;
- "replay": with `algorithm.routing_replay.mode: replay` and hand-made recorded experts
  (`routed_batch`): what every router of every rank routed in one forward over the batch, its
  logprobs and entropy, and the recompute's logprobs and routing counts.

Global rank 0 writes what it saw to `workdir/<phase>.pt`; the parent returns it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from actor_on_cpu import VOCAB, varied_batch, with_recorded_experts

from rlinf.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    Config,
    LoggerConfig,
    ModelConfig,
    OptimConfig,
    RoutingReplayConfig,
    RunnerConfig,
)
from rlinf.data.batch import RolloutBatch

ROWS = 8  # 4 GRPO groups of 2
MOE_LAYERS, EXPERTS = 2, 8  # of the checkpoint `write_checkpoint` makes


@dataclass(frozen=True)
class Layout:
    name: str
    world: int
    tp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    pack_sequences: bool = False
    grouped_experts: bool = False  # rlinf's grouped-GEMM experts instead of SequentialMLP


def write_checkpoint(out: Path, **overrides) -> Path:
    """A random fp32 tiny DeepSeek-V3 whose heads (4), experts (8), vocabulary (64) and compressed
    KV + RoPE width (32 + 16) divide by 2; layer 0 dense, layers 1-2 MoE. `overrides`: further
    DeepseekV3Config fields."""
    from rlinf.models.tiny import TinyModelSettings, random_deepseek_v3

    random_deepseek_v3(
        TinyModelSettings(num_hidden_layers=3, hidden_size=64), vocab_size=VOCAB, **overrides
    ).save_pretrained(out)
    return out


def actor_config(layout: Layout, checkpoint: Path, log_dir: Path, routing_replay: str = "none") -> Config:
    model = ModelConfig(
        model_path=str(checkpoint),
        precision="fp32",
        tensor_model_parallel_size=layout.tp,
        expert_model_parallel_size=layout.ep,
        sequence_parallel=layout.sequence_parallel,
        moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=layout.grouped_experts,
    )
    # Adam divides by |g| + eps: with eps 1e-4 a last-bit difference of a near-zero gradient entry
    # (sums taken in another order on other layouts) stays far below the update's scale.
    optim = OptimConfig(lr=1e-3, adam_eps=1e-4, clip_grad=1e9)
    actor = ActorConfig(
        training_backend="megatron",
        micro_batch_size=2,
        global_batch_size=ROWS,
        seq_length=64,
        model=model,
        optim=optim,
        pack_sequences=layout.pack_sequences,
    )
    runner = RunnerConfig(seed=7, logger=LoggerConfig(log_path=str(log_dir)))
    algorithm = AlgorithmConfig(group_size=2, routing_replay=RoutingReplayConfig(routing_replay))
    return Config(actor=actor, algorithm=algorithm, runner=runner)


def grpo_batch() -> RolloutBatch:
    """8 rows with left-padded prompts (3..6 tokens) and right-padded responses (2..7 tokens), and
    advantages of both signs."""
    return varied_batch(
        (3, 6, 4, 5, 6, 3, 5, 4),
        (7, 2, 5, 4, 3, 6, 7, 5),
        seed=11,
        advantages=(1.0, -1.0, 0.5, -0.5, -1.0, 1.0, 0.8, -0.8),
    )


def routed_batch() -> RolloutBatch:
    """grpo_batch with hand-made recorded experts (actor_on_cpu.recorded_experts, all 8 in use)."""
    return with_recorded_experts(grpo_batch(), MOE_LAYERS, EXPERTS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_layout(layout: Layout, checkpoint: Path, workdir: Path, phase: str) -> dict:
    """Runs `phase` at `layout` in `layout.world` fresh processes; rank 0's results."""
    import torch.multiprocessing as mp

    workdir.mkdir(parents=True, exist_ok=True)
    mp.start_processes(
        _rank_main,
        args=(layout, str(checkpoint), str(workdir), phase, _free_port()),
        nprocs=layout.world,
        start_method="spawn",
    )
    return torch.load(workdir / f"{phase}.pt", weights_only=False)


def _rank_main(rank: int, layout: Layout, checkpoint: str, workdir: str, phase: str, port: int) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))  # the spawned child imports cuda_on_cpu by path
    from cuda_on_cpu import cuda_on_cpu

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(layout.world),
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    work = Path(workdir)
    with cuda_on_cpu():
        from rlinf.workers.actor.megatron_actor import MegatronActor

        replay = "replay" if phase == "replay" else "none"
        cfg = actor_config(layout, Path(checkpoint), work / "logs", routing_replay=replay)
        actor = MegatronActor(cfg, rank=rank, world_size=layout.world, device="cpu")
        result = {"train": _train, "resume": _resume, "replay": _replay}[phase](actor, work)
    if rank == 0:
        torch.save(result, work / f"{phase}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _with_old_logprobs(actor, batch: RolloutBatch) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor]:
    """The batch with this actor's logprobs as old_logprobs (as the runner's recompute sets them),
    and the logprobs and entropy of every row."""
    for chunk in actor.model:
        chunk.eval()
    with torch.no_grad():
        logprobs, entropy = actor.forward_micro(batch)
    logprobs, entropy = logprobs.detach().cpu(), entropy.detach().cpu()
    return replace(batch, old_logprobs=logprobs), logprobs, entropy


def _exported(actor) -> dict[str, torch.Tensor]:
    """The HF-named export, copied: on the CPU the bridge hands out the parameters themselves."""
    return {name: tensor.clone() for name, tensor in actor.named_weights().items()}


def _train(actor, work: Path) -> dict:
    batch, logprobs, entropy = _with_old_logprobs(actor, grpo_batch())
    result = {"exported_before": _exported(actor), "logprobs": logprobs, "entropy": entropy}
    result["lm_head"] = _lm_head(actor)
    grads: dict[str, torch.Tensor] = {}
    clip = actor.clip_grad_norm

    def catch_then_clip(max_norm: float) -> float:
        grads.update(full_gradients(actor))
        return clip(max_norm)

    actor.clip_grad_norm = catch_then_clip
    result["metrics_step1"] = actor.train(batch, 1)
    actor.clip_grad_norm = clip
    result["grads"] = grads
    result["exported_step1"] = _exported(actor)
    actor.save(str(work / "checkpoint"))
    batch, _, _ = _with_old_logprobs(actor, grpo_batch())
    result["metrics_step2"] = actor.train(batch, 2)
    result["exported_step2"] = _exported(actor)
    return result


def _resume(actor, work: Path) -> dict:
    actor.load(str(work / "checkpoint"))
    batch, _, _ = _with_old_logprobs(actor, grpo_batch())
    return {"metrics_step2": actor.train(batch, 2), "exported_step2": _exported(actor)}


def _replay(actor, _work: Path) -> dict:
    """Routing replay on `routed_batch`. `ranks` holds, for every global rank, its TP rank and
    what each MoE router returned in one forward over the whole batch (the routing map [tokens the
    router saw, experts], in the router's token order); the rest is what the reporting rank saw."""
    import torch.distributed as dist
    from megatron.core.transformer.moe.router import TopKRouter

    batch = routed_batch()
    routers = [m for chunk in actor.model for m in chunk.modules() if isinstance(m, TopKRouter)]
    routes: list[list[torch.Tensor]] = [[] for _ in routers]
    hooks = [
        router.register_forward_hook(lambda _m, _i, out, seen=seen: seen.append(out[1].detach().clone()))
        for router, seen in zip(routers, routes, strict=True)
    ]
    try:
        for chunk in actor.model:
            chunk.eval()
        with torch.no_grad():
            logprobs, entropy = actor.forward_micro(batch)
    finally:
        for hook in hooks:
            hook.remove()
    ranks: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, {"tp_rank": actor.tp_rank, "routes": routes})
    recompute = actor.compute_logprobs(batch)  # collective: the TP ranks sum their routing counts
    return {"ranks": ranks, "logprobs": logprobs.cpu(), "entropy": entropy.cpu(), "recompute": recompute}


def _lm_head(actor) -> dict:
    """Every rank's largest differences between the response-rows LM head and GPTModel's
    full-vocabulary one (full_vocab.py) on `grpo_batch`, right-padded and packed THD."""
    import torch.distributed as dist
    from full_vocab import largest_differences

    result = {}
    layout = actor.cfg.actor.pack_sequences
    for packed in (False, True):
        actor.cfg.actor.__dict__["pack_sequences"] = packed  # a frozen dataclass
        ranks: list[dict | None] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, largest_differences(actor, grpo_batch()))
        result["packed" if packed else "padded"] = ranks
    actor.cfg.actor.__dict__["pack_sequences"] = layout
    return result


def full_gradients(actor) -> dict[str, torch.Tensor]:
    """Every parameter's reduced gradient, gathered to full shape under its HF name (collective).

    megatron's distributed optimizer leaves each data-parallel rank only its shard of every grad
    bucket after the reduce-scatter: the shards are all-gathered first. The bridge's export then
    gathers TP / EP pieces and renames, exactly as for the weights, with each parameter's data
    pointing at its gradient for the duration."""
    import torch.distributed as dist

    for buffer in actor._buffers():
        size = buffer.data_parallel_world_size
        if size == 1:
            continue
        rank = dist.get_rank(buffer.data_parallel_group)
        for bucket in buffer.buckets:
            shard = bucket.grad_data.view(size, -1)[rank].clone()
            dist.all_gather_into_tensor(bucket.grad_data, shard, group=buffer.data_parallel_group)
    params = [p for chunk in actor.model for p in chunk.parameters()]
    weights = [p.data for p in params]
    try:
        for p in params:
            p.data = p.main_grad
        exported = dict(actor.iter_hf_weights(cpu=True)) if dist.get_rank() == 0 else {}
        if dist.get_rank() != 0:
            for _ in actor.iter_hf_weights(cpu=False):
                pass
    finally:
        for p, w in zip(params, weights, strict=True):
            p.data = w
    return {name: t.clone() for name, t in exported.items() if "e_score_correction_bias" not in name}
