"""Atomic, pruned checkpoint directories: <root>/step_<N>, written as tmp dir then renamed."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE_MARKER = "COMPLETE"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, half-written, corrupt or from an incompatible run; names the file."""


class CheckpointManager:
    def __init__(self, root: str | Path, keep: int) -> None:
        self.root = Path(root)
        self.keep = keep

    def path_for(self, step: int) -> Path:
        return self.root / f"step_{step}"

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """`write(tmp_dir)` fills a temporary directory that is renamed into place only when complete,
        so an interrupted save leaves the previous checkpoints untouched."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path_for(step)
        tmp = self.root / f".tmp_step_{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write(tmp)
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"step": step}))
        if final.exists():  # re-saving the same step (e.g. signal right after a periodic save)
            shutil.rmtree(final)
        tmp.rename(final)
        self._prune()
        return final

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for child in self.root.iterdir():
            match = STEP_DIR.match(child.name)
            if match and (child / COMPLETE_MARKER).is_file():
                found.append((int(match.group(1)), child))
        return [path for _, path in sorted(found)]

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def _prune(self) -> None:
        for old in self.checkpoints()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for tmp in self.root.glob(".tmp_step_*"):
            shutil.rmtree(tmp, ignore_errors=True)


def check_complete(path: Path) -> None:
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    if not (path / COMPLETE_MARKER).is_file():
        raise CheckpointError(
            f"{path}: incomplete checkpoint (no {COMPLETE_MARKER} marker; the save was interrupted)"
        )


def load_hf_weights_into(model, directory: Path) -> None:
    """Load an HF save_pretrained dir into `model` in place (strict), naming any bad file.

    Loading goes through transformers, because its on-disk layout is not always the in-memory one
    (transformers 5 stores fused MoE experts as per-expert tensors and converts on load).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from rlinf.models.loader import load_causal_lm

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
