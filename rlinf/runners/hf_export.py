"""An actor checkpoint out as a Hugging Face folder, to evaluate or serve (python -m rlinf.export_hf).

- torch actor: the checkpoint's actor/model already is a save_pretrained folder; it is copied.
- megatron actor: the dist checkpoint is sharded by the layout that wrote it and megatron's loader
  does not reshard, so as many processes as it had actor ranks each build the actor from the
  checkpoint's resolved config, load their shard, and run the weight sync's bridge export
  (`ActorWorker.export_hf`): the same bit-exact gathers that feed the rollout engines.

The folder is written under a temporary name beside `out` and renamed only when complete; a failed
export removes it. During a run, `runner.export_hf_interval` writes <output_dir>/<experiment>/hf/step_<N>
through the live actor group instead (`export_during_run`).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rlinf.config.loader import config_from_yaml_dict
from rlinf.config.schema import Config
from rlinf.config.typed import ConfigError
from rlinf.runners.checkpointing import ACTOR_DIR, checkpoint_root
from rlinf.utils.checkpoint import CheckpointError, CheckpointManager, check_complete, check_weight_files

HF_EXPORT_DIR = "hf"  # <output_dir>/<experiment_name>/hf/step_<N>, beside checkpoints/
KEEP_ALL = sys.maxsize  # exports are the run's deliverables: none is pruned
RESOLVED_CONFIG = "resolved_config.yaml"
TORCH_MODEL_DIR = "model"  # rlinf.workers.actor.torch_actor.MODEL_DIR (not imported: it pulls in torch)

# (rank, world size, step dir, folder to fill): builds the actor, loads, exports (collective).
RankExport = Callable[[int, int, Path, Path], None]


def hf_export_root(cfg: Config) -> Path:
    return checkpoint_root(cfg).parent / HF_EXPORT_DIR


def export_during_run(cfg: Config, roles, step: int) -> Path:
    """The live actor's weights as <hf_export_root>/step_<step>, written atomically (collective)."""
    manager = CheckpointManager(hf_export_root(cfg), keep=KEEP_ALL)
    return manager.save(step, lambda tmp: roles.actor.export_hf(str(tmp)))


def checkpoint_config(step_dir: Path) -> Config:
    """The resolved config a complete checkpoint was saved with (its actor backend and layout)."""
    import yaml

    check_complete(step_dir)
    config_file = step_dir / RESOLVED_CONFIG
    try:
        return config_from_yaml_dict(yaml.safe_load(config_file.read_text()))
    except (OSError, yaml.YAMLError, ConfigError, TypeError) as err:
        raise CheckpointError(f"{config_file}: unreadable resolved config: {err}") from None


def export_checkpoint(step_dir: Path, out: Path, spawn_ranks: Callable[[Config, Path, Path], None]) -> Path:
    """Write the HF folder of the checkpoint `step_dir` to `out` (which must not exist).
    `spawn_ranks(cfg, step_dir, folder)`: runs a Megatron export in the processes it needs."""
    if out.exists():
        raise ConfigError(f"{out}: already exists; an export never overwrites a folder, name a new one")
    cfg = checkpoint_config(step_dir)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        tmp.mkdir(parents=True)
        if cfg.actor.training_backend == "torch":
            _copy_torch_model(step_dir / ACTOR_DIR / TORCH_MODEL_DIR, tmp)
        else:
            _check_base_model(cfg)
            spawn_ranks(export_config(cfg), step_dir, tmp)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def export_config(cfg: Config) -> Config:
    """The checkpoint's config for an export's actor: nothing is written to the run's logs folder."""
    return replace(cfg, runner=replace(cfg.runner, logger=replace(cfg.runner.logger, log_path=None)))


def _copy_torch_model(model_dir: Path, tmp: Path) -> None:
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: missing (torch actor checkpoint: its HF model folder)")
    check_weight_files(model_dir)
    shutil.copytree(model_dir, tmp, dirs_exist_ok=True)


def _check_base_model(cfg: Config) -> None:
    """The base HF checkpoint the actor is built from, and whose config and tokenizer the export
    carries, must still be where the run read it."""
    from rlinf.models.hf_checkpoint import load_model_config
    from rlinf.models.tiny import resolve_model_path

    load_model_config(resolve_model_path(cfg.actor.model.model_path))


def actor_ranks(cfg: Config) -> int:
    """How many actor ranks wrote a Megatron checkpoint: its loader needs the same number."""
    from rlinf.config.validate import placement_of

    return max(len(placement_of(cfg).gpus["actor"]), 1)


def megatron_rank_export(
    rank: int, world: int, step_dir: Path, folder: Path, cfg: Config, device: str
) -> None:
    """One rank of a Megatron export: the actor at the checkpoint's layout, its shard, the export."""
    import torch.distributed as dist

    from rlinf.workers.actor.megatron_actor import MegatronActor

    actor = MegatronActor(cfg, rank=rank, world_size=world, device=device)
    actor.load(str(step_dir / ACTOR_DIR), weights_only=True)
    actor.export_hf(str(folder))
    dist.destroy_process_group()
