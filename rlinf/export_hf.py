"""python -m rlinf.export_hf <checkpoint step dir> <out dir>: an actor checkpoint (torch or Megatron)
as a Hugging Face save_pretrained folder with its tokenizer (rlinf.runners.hf_export).

A Megatron checkpoint is exported on as many GPUs as it had actor ranks (one process each, NCCL).
Bad input ends with one line and the exit code of its class (rlinf.config.exit_codes): a missing or
incomplete step is a checkpoint error, an out dir that exists a config error; nothing is left behind.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from rlinf.config import exit_codes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m rlinf.export_hf",
        description="Export an actor checkpoint (results/<experiment>/checkpoints/step_<N>) as a Hugging "
        "Face folder (weights, config.json, tokenizer) that transformers and SGLang load.",
        epilog="exit codes: 0 ok, 2 the out dir exists, 5 a missing, incomplete or unreadable checkpoint, "
        "6 the run's base model (config, tokenizer) is gone",
    )
    parser.add_argument("step_dir", type=Path, help="a complete checkpoint folder step_<N>")
    parser.add_argument("out_dir", type=Path, help="the folder to create (must not exist)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from rlinf.runners.hf_export import export_checkpoint
    from rlinf.runners.main import classify_input_error

    args = parse_args(argv)
    try:
        out = export_checkpoint(args.step_dir, args.out_dir, spawn_ranks=_spawn_on_gpus)
    except RankFailed as err:
        return err.code  # the failed rank printed its line
    except Exception as err:
        kind = classify_input_error(err)
        if kind is None:
            raise
        print(f"{kind[1]}: {err}", file=sys.stderr)
        return kind[0]
    print(f"exported {args.step_dir} -> {out}")
    return exit_codes.OK


class RankFailed(RuntimeError):
    def __init__(self, code: int) -> None:
        super().__init__(f"an export rank exited with {code}")
        self.code = code


def _spawn_on_gpus(cfg, step_dir: Path, folder: Path) -> None:
    import torch
    import torch.multiprocessing as mp

    from rlinf.config.typed import ConfigError
    from rlinf.runners.hf_export import actor_ranks

    world = actor_ranks(cfg)
    if torch.cuda.device_count() < world:
        raise ConfigError(
            f"{step_dir}: a Megatron checkpoint of {world} actor rank(s) is exported on as many GPUs; "
            f"{torch.cuda.device_count()} visible"
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    try:
        mp.start_processes(
            _rank_main, args=(world, step_dir, folder, cfg, port), nprocs=world, start_method="spawn"
        )
    except mp.ProcessExitedException as err:
        raise RankFailed(err.exit_code or exit_codes.RUN_FAILED) from None


def _rank_main(rank: int, world: int, step_dir: Path, folder: Path, cfg, port: int) -> None:
    from rlinf.runners.hf_export import megatron_rank_export
    from rlinf.runners.main import classify_input_error

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    try:
        megatron_rank_export(rank, world, step_dir, folder, cfg, device="cuda")
    except Exception as err:
        kind = classify_input_error(err)
        if kind is None:
            raise
        print(f"{kind[1]}: {err}", file=sys.stderr)
        sys.exit(kind[0])


if __name__ == "__main__":
    sys.exit(main())
