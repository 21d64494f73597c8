"""Writes HF-named weights as a Hugging Face `save_pretrained` folder: safetensors shards (with their
index when there are several), the base checkpoint's config.json with the weights' dtype, and its
tokenizer, so transformers and SGLang load it as they load the base model.

The weights come as a stream of (HF name, tensor), the Megatron actor's bridge export included, and
are written shard by shard: a 16B model never sits in host memory whole."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

SHARD_BYTES = 5 * 2**30  # transformers' save_pretrained default (max_shard_size="5GB")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def write_hf_folder(
    tensors: Iterable[tuple[str, torch.Tensor]],
    base_model_path: str,
    out: Path,
    *,
    trust_remote_code: bool = False,
    shard_bytes: int = SHARD_BYTES,
) -> None:
    """Fill `out` (an existing, empty folder) with the weights, config and tokenizer."""
    from rlinf.models.hf_checkpoint import load_model_config, load_tokenizer

    # Read before the weights stream: a collective export must not stop half way on a bad base path.
    config = load_model_config(base_model_path)
    tokenizer = load_tokenizer(base_model_path, trust_remote_code=trust_remote_code)
    config.dtype = _write_shards(tensors, out, shard_bytes)  # may differ from the base checkpoint's
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _write_shards(tensors: Iterable[tuple[str, torch.Tensor]], out: Path, shard_bytes: int) -> torch.dtype:
    from safetensors.torch import save_file

    files: list[tuple[Path, list[str]]] = []
    shard: dict[str, torch.Tensor] = {}
    size, total = 0, 0
    bytes_by_dtype: dict[torch.dtype, int] = {}

    def flush() -> None:
        path = out / f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, str(path), metadata={"format": "pt"})
        files.append((path, list(shard)))
        shard.clear()

    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > shard_bytes:
            flush()
            size = 0
        # A copy: on the CPU the bridge hands out the parameters themselves, and safetensors
        # refuses tensors that share storage.
        shard[name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += nbytes
        total += nbytes
        bytes_by_dtype[tensor.dtype] = bytes_by_dtype.get(tensor.dtype, 0) + nbytes
    if shard:
        flush()
    if not files:
        raise ValueError("the weight export yielded no tensors")
    if len(files) == 1:
        files[0][0].rename(out / SINGLE_FILE)
    else:
        _name_shards_and_index(files, out, total)
    # The bulk's dtype: a few small tensors (router score biases) may stay in fp32 beside bf16 weights.
    return max(bytes_by_dtype, key=bytes_by_dtype.__getitem__)


def _name_shards_and_index(files: list[tuple[Path, list[str]]], out: Path, total: int) -> None:
    """The save_pretrained names (model-0000i-of-0000N), known once N is, and the name -> file index."""
    weight_map = {}
    for i, (path, names) in enumerate(files, start=1):
        final = f"model-{i:05d}-of-{len(files):05d}.safetensors"
        path.rename(out / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
