"""What every torch-based worker does on start: pick its device, size its threads, seed, load."""

from __future__ import annotations

import torch

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def worker_device() -> torch.device:
    # Ray sets CUDA_VISIBLE_DEVICES to the GPU(s) it assigned; a CPU-only worker sees none.
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def configure_threads(num_threads: int | None) -> None:
    if num_threads:
        torch.set_num_threads(num_threads)


def load_policy(model_path: str, precision: str, trust_remote_code: bool, device: torch.device):
    """(model, tokenizer) from an HF checkpoint dir or tiny://bootstrap, in eval mode on `device`."""
    from rlinf.models.hf_checkpoint import load_causal_lm, load_tokenizer
    from rlinf.models.tiny import resolve_model_path

    path = resolve_model_path(model_path)
    model = load_causal_lm(path, precision=precision, device=device)
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    return model, tokenizer


def eos_token_ids(generation_config, tokenizer) -> list[int]:
    """EOS ids from the checkpoint's generation config (None: none) and the tokenizer (chat models
    often have several)."""
    ids: set[int] = set()
    for source in (generation_config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError("the checkpoint defines no eos_token_id (generation_config.json or tokenizer)")
    return sorted(ids)


def pad_token_id(tokenizer, eos_ids: list[int]) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]


def cpu_weights(model) -> dict[str, torch.Tensor]:
    """A model's current state dict as CPU copies (tests compare actor and rollout with it)."""
    return {name: t.detach().cpu().clone() for name, t in model.state_dict().items()}
