"""The folders a run writes (checkpoints; logs with the TensorBoard files), made ready before Ray starts.

Each folder is created, locked for this run (rlinf/utils/run_lock.py) and probed with a file
written and removed. Partial saves a crashed run left behind are removed, and the free space is
compared with the size a checkpoint will take. A folder that cannot be used is an OutputFolderError
naming the recipe key, the folder and the OS error: the run stops before it trains a step.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlinf.config.schema import Config
from rlinf.config.typed import ConfigError
from rlinf.runners.checkpointing import checkpoint_root
from rlinf.utils.checkpoint import CheckpointManager, folder_bytes, safetensors_parameter_count
from rlinf.utils.run_lock import FolderInUseError, FolderLock

logger = logging.getLogger(__name__)

PROBE_FILE = ".rlinf_write_probe"
CHECKPOINT_KEY = "runner.output_dir"


class OutputFolderError(ConfigError):
    """An output folder cannot be used: another run holds it, or it cannot be written."""


@dataclass(frozen=True)
class OutputFolder:
    key: str  # the recipe key that chose the folder, for messages
    path: Path


def output_folders(cfg: Config) -> list[OutputFolder]:
    """The folders this run writes: the checkpoint folder when it saves, and the log folder."""
    folders = [OutputFolder("runner.logger.log_path", Path(str(cfg.runner.logger.log_path)))]
    if cfg.runner.save_at_end or cfg.runner.save_interval > 0:
        folders.insert(0, OutputFolder(CHECKPOINT_KEY, checkpoint_root(cfg)))
    unique: dict[Path, OutputFolder] = {}
    for folder in folders:
        unique.setdefault(folder.path.resolve(), folder)
    return list(unique.values())


@contextmanager
def held_output_folders(cfg: Config) -> Iterator[None]:
    """Hold every output folder for the duration of the block; on the way out release the locks and
    remove the folders this call created if they are still empty (a run refused early leaves nothing)."""
    locks: list[FolderLock] = []
    created: list[Path] = []
    try:
        for folder in output_folders(cfg):
            created += _make(folder)
            locks.append(_lock(folder))
            _probe(folder)
            if folder.key == CHECKPOINT_KEY:
                _remove_partial_saves(folder)
                _warn_if_a_checkpoint_will_not_fit(folder, cfg)
        yield
    finally:
        for lock in reversed(locks):
            lock.release()
        for path in reversed(created):
            try:
                path.rmdir()
            except OSError:  # not empty: the run wrote there
                break


def _make(folder: OutputFolder) -> list[Path]:
    """Creates the folder and its missing parents; returns those it created, outermost first."""
    missing = [p for p in (folder.path, *folder.path.parents) if not p.exists()][::-1]
    if folder.path.exists() and not folder.path.is_dir():
        raise OutputFolderError(f"{folder.key}: {folder.path} is a file, not a folder")
    try:
        folder.path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputFolderError(f"{folder.key}: {folder.path} cannot be created: {err}") from None
    return missing


def _lock(folder: OutputFolder) -> FolderLock:
    lock = FolderLock(folder.path)
    try:
        lock.acquire()
    except FolderInUseError as err:
        raise OutputFolderError(
            f"{folder.key}: {err}; wait for it to finish, or give this run another runner.experiment_name"
        ) from None
    except OSError as err:
        raise OutputFolderError(f"{folder.key}: {folder.path} cannot be written: {err}") from None
    return lock


def _probe(folder: OutputFolder) -> None:
    probe = folder.path / f"{PROBE_FILE}.{os.getpid()}"
    try:
        for stale in folder.path.glob(f"{PROBE_FILE}.*"):  # a run killed while probing (we hold the lock)
            stale.unlink()
        with probe.open("wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as err:
        probe.unlink(missing_ok=True)
        raise OutputFolderError(f"{folder.key}: {folder.path} cannot be written: {err}") from None


def _remove_partial_saves(folder: OutputFolder) -> None:
    for partial in CheckpointManager(folder.path, keep=1).partial_saves():
        try:
            shutil.rmtree(partial)
        except OSError as err:
            raise OutputFolderError(
                f"{folder.key}: {partial}, a partial save an earlier run left, cannot be removed: {err}; "
                "remove it by hand"
            ) from None
        logger.info("removed %s, a partial save an earlier run left", partial)


def expected_checkpoint_bytes(cfg: Config, root: Path) -> tuple[int, str]:
    """(bytes, how they were estimated): the latest checkpoint's size, else weights + Adam state."""
    latest = CheckpointManager(root, keep=1).latest()
    if latest is not None:
        return folder_bytes(latest), f"the size of {latest.name}"
    params = safetensors_parameter_count(cfg.actor.model.model_path)
    precision = cfg.actor.model.precision
    weight_bytes = 4 if precision == "fp32" else 2
    masters = 0 if precision == "fp32" else 4  # fp32 master weights beside bf16/fp16 ones
    how = f"{params / 1e6:.1f}M parameters: {precision} weights + fp32 Adam moments"
    return params * (weight_bytes + 8 + masters), how + (" + fp32 master weights" if masters else "")


def _warn_if_a_checkpoint_will_not_fit(folder: OutputFolder, cfg: Config) -> None:
    needed, how = expected_checkpoint_bytes(cfg, folder.path)
    free = shutil.disk_usage(folder.path).free
    if free < needed:
        logger.warning(
            "%s: %s has %.1f MiB free, but a checkpoint takes about %.1f MiB (%s): the first save will "
            "fail unless space is freed",
            folder.key,
            folder.path,
            free / 2**20,
            needed / 2**20,
            how,
        )
