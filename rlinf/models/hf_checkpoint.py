"""Load DeepSeek-V3-family HF checkpoints (Moonlight-16B-A3B, the tiny model) with transformers' own code.

The model is always built from transformers' native `DeepseekV3ForCausalLM`: a checkpoint's `auto_map`
(remote modelling code) is ignored, so the policy trained here is the same code on every machine.
Only the tokenizer may come from remote code (Moonlight ships a tiktoken tokenizer that way).

Multi-token-prediction (MTP) layers that a checkpoint stores after the last decoder layer, as
`model.layers.{num_hidden_layers + i}.*`, are skipped: RL neither runs nor trains them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerBase

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("deepseek_v3",)

PRECISION_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

# transformers fills any absent config field with full DeepSeek-V3's value (q_lora_rank 1536,
# 256 experts, 8 groups, ...), which would silently build a different network than the checkpoint's
# or route tokens differently. These fields decide shapes or routing, so they must be written out.
REQUIRED_CONFIG_FIELDS: tuple[str, ...] = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "first_k_dense_replace",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "norm_topk_prob",
)

# The native implementation only routes the DeepSeek-V3 way; other values of these fields describe
# a model it would silently run wrong.
NATIVE_ROUTING = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}

WEIGHT_FILE_PATTERNS: tuple[str, ...] = ("*.safetensors", "pytorch_model*.bin")


class ModelLoadError(ValueError):
    """A checkpoint directory cannot be used; the message names the path and what is wrong."""


def load_model_config(path: str) -> DeepseekV3Config:
    """The checkpoint's config as transformers' native DeepseekV3Config, after checking it."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import DeepseekV3Config

    config_file = _checkpoint_dir(path) / "config.json"
    raw = _read_config_json(config_file)
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"{config_file}: field 'model_type' is {model_type!r}; supported values: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    missing = [name for name in REQUIRED_CONFIG_FIELDS if name not in raw]
    if missing:
        raise ModelLoadError(
            f"{config_file}: missing required field(s) {', '.join(missing)} "
            f"(they fix the {model_type} architecture's shapes and routing)"
        )
    for name, native in NATIVE_ROUTING.items():
        if raw.get(name, native) != native:
            raise ModelLoadError(
                f"{config_file}: field {name!r} is {raw[name]!r}; transformers' native {model_type} "
                f"implementation supports only {native!r}"
            )
    # Remote code is never used for the model, and a config saved from this one (an export)
    # must not point at modelling files that will not be next to it.
    raw.pop("auto_map", None)
    try:
        return DeepseekV3Config.from_dict(raw)
    # transformers' configs check field types (strict dataclasses) and some cross-field rules
    except (TypeError, ValueError, StrictDataclassError) as error:
        raise ModelLoadError(f"{config_file}: invalid config: {error}") from error


def load_causal_lm(
    path: str, *, precision: str = "fp32", device: str | torch.device = "cpu"
) -> DeepseekV3ForCausalLM:
    """The checkpoint as a native DeepseekV3ForCausalLM in eval mode, in `precision`, on `device`.

    Every decoder weight must come from the checkpoint: a missing or unexpected key (other than
    MTP layers) is an error rather than a randomly initialised or silently dropped tensor.
    """
    from transformers import DeepseekV3ForCausalLM

    if precision not in PRECISION_DTYPES:
        raise ModelLoadError(f"precision must be one of {', '.join(PRECISION_DTYPES)}, got {precision!r}")
    config = load_model_config(path)
    directory = Path(path)
    if not any(any(directory.glob(pattern)) for pattern in WEIGHT_FILE_PATTERNS):
        raise ModelLoadError(f"{directory}: no weight files (looked for {', '.join(WEIGHT_FILE_PATTERNS)})")
    with _skipping_mtp_layers(config):
        model, info = DeepseekV3ForCausalLM.from_pretrained(
            directory,
            config=config,
            dtype=PRECISION_DTYPES[precision],
            attn_implementation="sdpa",
            experts_implementation=experts_implementation(),
            output_loading_info=True,
        )
    mismatched = {kind: sorted(info[kind]) for kind in ("missing_keys", "unexpected_keys") if info[kind]}
    if mismatched:
        details = "; ".join(f"{kind}: {', '.join(keys[:8])}" for kind, keys in mismatched.items())
        raise ModelLoadError(f"{directory}: checkpoint weights do not match its config.json ({details})")
    # Loading straight onto a device needs `accelerate` (device_map); the CPU detour avoids that.
    return model.to(torch.device(device)).eval()


def load_tokenizer(path: str, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer (AutoTokenizer); Moonlight's needs trust_remote_code=True."""
    from transformers import AutoTokenizer

    directory = _checkpoint_dir(path)
    try:
        return AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"{directory}: cannot load the tokenizer: {error}") from error


def experts_implementation() -> str:
    """How the routed experts run: transformers' grouped_mm where the torch build has the op.

    grouped_mm runs every expert's tokens in one kernel (no per-expert Python loop) on CUDA and
    CPU; transformers itself falls back to a loop when the kernel cannot take an input (old GPUs,
    misaligned CPU tensors on torch <= 2.10). On a 2-core CPU it matches the eager loop on the
    tiny model (docs/models.md); batched_mm is several times slower there.
    """
    has_grouped_mm = hasattr(torch.nn.functional, "grouped_mm") or hasattr(torch, "_grouped_mm")
    return "grouped_mm" if has_grouped_mm else "eager"


def _checkpoint_dir(path: str) -> Path:
    directory = Path(path)
    if not directory.is_dir():
        hint = " (resolve tiny:// paths with rlinf.models.resolve_model_path first)" if "://" in path else ""
        raise ModelLoadError(f"model directory {path} does not exist or is not a directory{hint}")
    return directory


def _read_config_json(config_file: Path) -> dict:
    if not config_file.is_file():
        raise ModelLoadError(f"{config_file} is missing: a HF checkpoint directory needs its config.json")
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ModelLoadError(
            f"{config_file} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from error
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{config_file} must hold a JSON object, got {type(raw).__name__}")
    return raw


@contextmanager
def _skipping_mtp_layers(config: DeepseekV3Config) -> Iterator[None]:
    """Tell transformers that the checkpoint's MTP layers are expected extras, not a mismatch.

    transformers only knows full DeepSeek-V3's MTP index (layer 61); for any other depth the MTP
    weights would be reported as unexpected keys. The class attribute is read when the model
    object is built inside from_pretrained, so it is widened for that call only.
    """
    from transformers import DeepseekV3ForCausalLM

    first = config.num_hidden_layers
    indices = "|".join(str(first + i) for i in range(config.num_nextn_predict_layers))
    original = DeepseekV3ForCausalLM._keys_to_ignore_on_load_unexpected
    if indices:
        DeepseekV3ForCausalLM._keys_to_ignore_on_load_unexpected = [
            *(original or []),
            rf"^model\.layers\.({indices})\.",
        ]
    try:
        yield
    finally:
        DeepseekV3ForCausalLM._keys_to_ignore_on_load_unexpected = original
