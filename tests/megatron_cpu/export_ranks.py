"""Rank functions for test_hf_export.py, in gloo processes on the CPU (spawned: importable by name).

- `train_and_save`: the real MegatronActor at a layout makes one GRPO update on `grpo_batch`, saves
  its dist checkpoint as the runner does (step_1/actor, the resolved config, the COMPLETE marker),
  and rank 0 writes the actor's logprobs of the batch before and after the update and its own
  bridge export after it to `trained.pt` beside the step;
- `export`: one rank of rlinf.runners.hf_export's Megatron export, as `python -m rlinf.export_hf`
  runs it on GPUs, here with device="cpu" under cuda_on_cpu.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).parent


def _join(rank: int, world: int, port: int) -> None:
    sys.path.insert(0, str(HERE))  # the spawned child imports cuda_on_cpu and many_ranks by path
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)


def train_and_save(rank: int, layout, checkpoint: str, step_dir: str, port: int) -> None:
    _join(rank, layout.world, port)
    from cuda_on_cpu import cuda_on_cpu
    from many_ranks import actor_config, grpo_batch

    from rlinf.config.loader import save_resolved_config
    from rlinf.utils.checkpoint import COMPLETE_MARKER
    from rlinf.workers.actor.megatron_actor import MegatronActor

    step = Path(step_dir)
    with cuda_on_cpu():
        cfg = actor_config(layout, Path(checkpoint), step.parent / "logs")
        actor = MegatronActor(cfg, rank=rank, world_size=layout.world, device="cpu")
        batch = grpo_batch()
        for chunk in actor.model:
            chunk.eval()
        with torch.no_grad():
            old, _ = actor.forward_micro(batch)
        batch.old_logprobs = old.detach().cpu()
        actor.train(batch, 1)
        for chunk in actor.model:
            chunk.eval()
        with torch.no_grad():
            trained, _ = actor.forward_micro(batch)
        exported = {name: t.clone() for name, t in actor.named_weights().items()}  # collective
        actor.save(str(step / "actor"))
    if rank == 0:
        save_resolved_config(cfg, step)
        (step / COMPLETE_MARKER).write_text(json.dumps({"step": 1}))
        result = {"before": old.cpu(), "after": trained.detach().cpu(), "exported": exported}
        torch.save(result, step.parent / "trained.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def export(rank: int, world: int, step_dir: str, folder: str, cfg, port: int) -> None:
    _join(rank, world, port)
    from cuda_on_cpu import cuda_on_cpu

    from rlinf.runners.hf_export import megatron_rank_export

    with cuda_on_cpu():
        megatron_rank_export(rank, world, Path(step_dir), Path(folder), cfg, device="cpu")
