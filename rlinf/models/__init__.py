"""DeepSeek-V3 / Moonlight checkpoints: loading, weight buckets, and the tiny CPU model."""

from rlinf.models.loader import (
    SUPPORTED_MODEL_TYPES,
    ModelLoadError,
    load_causal_lm,
    load_model_config,
    load_tokenizer,
)
from rlinf.models.tiny import (
    TinyModelSettings,
    build_tiny_checkpoint,
    ensure_tiny_checkpoint,
    resolve_model_path,
)
from rlinf.models.weights import (
    WeightLoadError,
    iter_weight_buckets,
    load_weight_bucket,
    max_weight_diff,
    weights_equal,
)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "ModelLoadError",
    "TinyModelSettings",
    "WeightLoadError",
    "build_tiny_checkpoint",
    "ensure_tiny_checkpoint",
    "iter_weight_buckets",
    "load_causal_lm",
    "load_model_config",
    "load_tokenizer",
    "load_weight_bucket",
    "max_weight_diff",
    "resolve_model_path",
    "weights_equal",
]
