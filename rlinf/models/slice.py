"""Random DeepSeek-V3 checkpoints for GPU tests and benchmarks, built where they are used.

The Moonlight slice: Moonlight-16B-A3B's published config (full width: hidden 2048, 16 heads,
kv_lora_rank 512, qk 128+64, v 128, 64 experts top-6 of 1408, 2 shared, first layer dense, vocab
163840) cut to a few layers, bf16. About 2.5B parameters at 4 layers (5 GB), so the GPU tests build
it on the GPU, in seconds, instead of storing it. (The GPU-sized tiny model is
rlinf.models.tiny.GPU_TINY_SETTINGS.)

Every config.json written here carries the DeepSeek fields that SGLang reads and transformers'
config class lacks (`moe_layer_freq`, `topk_method`, `scoring_func`, `ep_size`,
`num_nextn_predict_layers`), as real DeepSeek-V3 / Moonlight checkpoints do.

    python -m rlinf.models.slice --out DIR [--layers 4] [--dtype bf16] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

# Moonlight-16B-A3B-Instruct's config.json (moonshotai, as published), the fields that shape or
# route the network. Kept here rather than read from tests/ so the package builds it anywhere.
MOONLIGHT_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 163840,
    "hidden_size": 2048,
    "intermediate_size": 11264,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "n_shared_experts": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.446,
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "ep_size": 1,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 50000.0,
    "max_position_embeddings": 8192,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
    "bos_token_id": 163584,
    "eos_token_id": 163586,
}

# Fields SGLang's DeepSeek model reads from config.json that transformers' DeepseekV3Config drops.
SGLANG_CONFIG_FIELDS: dict[str, Any] = {
    "moe_layer_freq": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "ep_size": 1,
    "num_nextn_predict_layers": 0,
}

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
DTYPE_NAMES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def moonlight_slice_config(num_layers: int = 4, **overrides: Any) -> dict[str, Any]:
    """Moonlight's config with `num_layers` decoder layers (layer 0 dense, the rest MoE)."""
    if num_layers < 2:
        raise ValueError(f"a Moonlight slice needs >= 2 layers (one dense, one MoE), got {num_layers}")
    return MOONLIGHT_CONFIG | {"num_hidden_layers": num_layers} | overrides


def build_random_checkpoint(
    out_dir: str | Path,
    config_fields: dict[str, Any],
    *,
    dtype: str = "bf16",
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> Path:
    """Write a seeded random DeepseekV3ForCausalLM of `config_fields` to `out_dir` (safetensors).

    Initialised in fp32 on `device` (transformers' normal(0, initializer_range) init), then cast to
    `dtype` for saving; config.json gets SGLang's extra fields and the dtype.
    """
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    started = time.perf_counter()
    hf_fields = {k: v for k, v in config_fields.items() if k not in ("architectures", "model_type")}
    rope_theta = hf_fields.pop("rope_theta", 50000.0)
    config = DeepseekV3Config(**hf_fields, rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    torch.manual_seed(seed)
    with torch.device(device):
        model = DeepseekV3ForCausalLM(config)
    model = model.to(DTYPES[dtype]).eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    add_sglang_config_fields(out, torch_dtype=DTYPE_NAMES[dtype])
    report = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": dtype,
        "seed": seed,
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    (out / "slice_build.json").write_text(json.dumps(report, indent=2) + "\n")
    del model
    return out


def add_sglang_config_fields(checkpoint: str | Path, **extra: Any) -> None:
    """Add the DeepSeek fields SGLang reads (and `extra`) to a checkpoint's config.json, in place.

    Values already in the file win: a real checkpoint's own fields are never rewritten.
    """
    path = Path(checkpoint) / "config.json"
    config = json.loads(path.read_text())
    merged = SGLANG_CONFIG_FIELDS | extra | config
    path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")


def build_moonlight_slice(
    out_dir: str | Path, num_layers: int = 4, *, dtype: str = "bf16", device: str = "cuda", seed: int = 0
) -> Path:
    return build_random_checkpoint(
        out_dir, moonlight_slice_config(num_layers), dtype=dtype, device=device, seed=seed
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build a random Moonlight-shaped slice checkpoint.")
    parser.add_argument("--out", required=True, help="output checkpoint directory")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (layer 0 dense)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = build_moonlight_slice(args.out, args.layers, dtype=args.dtype, device=args.device, seed=args.seed)
    print((out / "slice_build.json").read_text(), end="")


if __name__ == "__main__":
    main()
