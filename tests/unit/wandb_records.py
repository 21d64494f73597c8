"""Reads back what wandb wrote offline: the run's `.wandb` transaction log, with wandb's own protobuf
records (wandb.proto). wandb >= 0.19 ships no Python reader for it (its writer is the Go wandb-core),
so the framing is read here: a 7-byte header (":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of
chunks, each with a 7-byte header (CRC-32C, length, type: 1 full, 2 first, 3 middle, 4 last)."""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 32768
CHUNK_HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    project: str = ""
    name: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)  # one dict per logged step, with "_step"


def read_offline_run(run_file: Path, timeout_s: float = 60.0) -> OfflineRun:
    """The run, once its log holds the exit record: wandb's service process (wandb-core) may still
    be writing after `run.finish()` returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        run, finished = _parse(run_file.read_bytes(), run_file)
        if finished or time.monotonic() > deadline:
            assert finished, f"{run_file}: no exit record after {timeout_s} s"
            return run
        time.sleep(0.2)


def _parse(data: bytes, run_file: Path) -> tuple[OfflineRun, bool]:
    from wandb.proto import wandb_internal_pb2

    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{run_file}: not a wandb transaction log"
    run, finished = OfflineRun(), False
    for payload in _records(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.project, run.name, run.tags = (
                record.run.project,
                record.run.display_name,
                list(record.run.tags),
            )
            _update(run.config, record.run.config)
        elif kind == "config":
            _update(run.config, record.config)
        elif kind == "history":
            run.history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
        elif kind == "exit":
            finished = True
    return run, finished


def _update(config: dict, record) -> None:
    for item in record.update:
        config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)


def _records(data: bytes):
    pos, parts = 7, []
    while pos + CHUNK_HEADER.size <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER.size:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        if kind == 0 and length == 0:
            break
        parts.append(data[pos + CHUNK_HEADER.size : pos + CHUNK_HEADER.size + length])
        pos += CHUNK_HEADER.size + length
        if kind in (FULL, LAST):
            yield b"".join(parts)
            parts = []


def offline_run_file(wandb_dir: Path) -> Path:
    """The one offline run's `.wandb` file under a wandb folder."""
    files = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, f"expected one offline run under {wandb_dir}/wandb, found {files}"
    return files[0]
