"""Atomic, pruned checkpoint directories: <root>/step_<N>, written as tmp dir then renamed."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE_MARKER = "COMPLETE"
TMP_PREFIX = ".tmp_step_"  # a save being written
ASIDE_PREFIX = ".step_"  # the previous copy of a step being replaced (.step_<N> -> step_<N>)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, half-written, corrupt or from an incompatible run; names the file."""


class CheckpointSaveError(CheckpointError):
    """A save failed (no space, read-only, permission...); its partial folder is already removed."""


# A failed write that leaves less than this free on its filesystem is taken for a full disk: some
# writers (torch.save) report a full disk without the OS error ("unexpected pos ...").
FULL_DISK_BELOW_BYTES = 16 * 2**20


class CheckpointManager:
    def __init__(self, root: str | Path, keep: int) -> None:
        self.root = Path(root)
        self.keep = keep

    def path_for(self, step: int) -> Path:
        return self.root / f"step_{step}"

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """`write(tmp_dir)` fills a temporary directory that is renamed into place only when complete,
        so an interrupted save leaves the previous checkpoints untouched.

        Replacing an existing step_<N> never leaves a moment without a complete copy: the old one is
        renamed aside, the new one renamed in, and only then is the old one deleted. A crash between
        the two renames leaves the old copy aside, and `checkpoints()` puts it back."""
        final = self.path_for(step)
        tmp = self.root / f"{TMP_PREFIX}{step}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            write(tmp)
            (tmp / COMPLETE_MARKER).write_text(json.dumps({"step": step}))
        except Exception as err:
            reason = describe_write_failure(err, self.root)  # before the cleanup frees the space
            cleanup = _remove_partial(tmp)
            raise CheckpointSaveError(f"saving step {step} to {final} failed: {reason}; {cleanup}") from err
        aside = self.root / f"{ASIDE_PREFIX}{step}"
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
            final.rename(aside)
        tmp.rename(final)
        shutil.rmtree(aside, ignore_errors=True)
        self._prune()
        return final

    def _restore_set_aside(self) -> None:
        """A save that crashed between its two renames left the previous complete copy aside."""
        for aside in self.root.glob(f"{ASIDE_PREFIX}*"):
            final = self.root / aside.name.removeprefix(".")
            if not final.exists() and (aside / COMPLETE_MARKER).is_file():
                aside.rename(final)

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        self._restore_set_aside()
        found = []
        for child in self.root.iterdir():
            match = STEP_DIR.match(child.name)
            if match and (child / COMPLETE_MARKER).is_file():
                found.append((int(match.group(1)), child))
        return [path for _, path in sorted(found)]

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def incomplete(self) -> list[Path]:
        """step_<N> folders without the COMPLETE marker (not written by this class's atomic save)."""
        if not self.root.is_dir():
            return []
        return sorted(
            (
                c
                for c in self.root.iterdir()
                if STEP_DIR.match(c.name) and not (c / COMPLETE_MARKER).is_file()
            ),
            key=lambda c: int(c.name.removeprefix("step_")),
        )

    def partial_saves(self) -> list[Path]:
        """Temporary folders of saves that never finished (a crash, a kill)."""
        return sorted(self.root.glob(f"{TMP_PREFIX}*")) if self.root.is_dir() else []

    def _prune(self) -> None:
        for old in self.checkpoints()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for tmp in self.root.glob(f"{TMP_PREFIX}*"):
            shutil.rmtree(tmp, ignore_errors=True)


def _remove_partial(tmp: Path) -> str:
    if not tmp.exists():
        return "nothing partial was left"
    try:
        shutil.rmtree(tmp)
    except OSError as err:
        return f"its partial folder {tmp} could not be removed ({err})"
    return "its partial folder was removed"


def _causes(err: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def describe_write_failure(err: BaseException, folder: Path) -> str:
    """The OS error behind a failed write (also through a worker's error), or a full disk measured."""
    for cause in _causes(err):
        if isinstance(cause, OSError) and cause.errno:
            return str(cause)
    try:
        free: int | None = shutil.disk_usage(folder).free
    except OSError:
        free = None
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if free is not None and free < FULL_DISK_BELOW_BYTES:
        return (
            f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}: {free / 2**20:.1f} MiB left on the "
            f"filesystem of {folder} (the writer said: {first_line})"
        )
    return first_line


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def safetensors_parameter_count(directory: str | Path) -> int:
    """Parameters stored in a directory's *.safetensors files, from their headers alone."""
    total = 0
    for file in sorted(Path(directory).glob("*.safetensors")):
        with file.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, entry in header.items():
            if name != "__metadata__":
                numel = 1
                for dim in entry["shape"]:
                    numel *= int(dim)
                total += numel
    return total


def check_complete(path: Path) -> None:
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    if not (path / COMPLETE_MARKER).is_file():
        raise CheckpointError(
            f"{path}: incomplete checkpoint (no {COMPLETE_MARKER} marker; the save was interrupted)"
        )


def check_weight_files(directory: Path) -> None:
    """Every *.safetensors file under `directory` has a readable header and all the bytes it
    announces: a truncated or overwritten file is named before any worker starts loading it.
    Reads only the headers (cheap even for a 16B checkpoint)."""
    for file in sorted(Path(directory).rglob("*.safetensors")):
        problem = _safetensors_problem(file)
        if problem:
            raise CheckpointError(f"{file}: corrupt weight file: {problem}")


def _safetensors_problem(file: Path) -> str | None:
    # Format: 8-byte little-endian header length, JSON header, then the tensor bytes whose
    # [begin, end) offsets (relative to the end of the header) the header lists.
    size = file.stat().st_size
    with file.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            return f"{size} bytes, shorter than the 8-byte header length"
        header_len = int.from_bytes(prefix, "little")
        if header_len > size - 8:
            return f"header announces {header_len} bytes but the file has {size - 8} after the length"
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return f"unreadable header: {err}"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    try:
        ends = [int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"]
    except (KeyError, TypeError, IndexError, ValueError):
        return "a header entry has no valid data_offsets"
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        return f"truncated: {size} bytes, the header announces {expected}"
    return None


def load_hf_weights_into(model, directory: Path) -> None:
    """Load an HF save_pretrained dir into `model` in place (strict), naming any bad file.

    Loading goes through transformers, because its on-disk layout is not always the in-memory one
    (transformers 5 stores fused MoE experts as per-expert tensors and converts on load).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from rlinf.models.hf_checkpoint import load_causal_lm

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors weight files")
    for file in files:
        try:
            load_file(str(file))
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{file}: corrupt weight file: {err}") from None
    dtype = next(model.parameters()).dtype
    precision = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}[str(dtype)]
    try:
        saved = load_causal_lm(str(directory), precision=precision, device="cpu")
        model.load_state_dict(saved.state_dict(), strict=True)
    except (RuntimeError, ValueError) as err:
        raise CheckpointError(f"{directory}: weights do not match the model: {err}") from None
