"""DeepSeek-V3 / Moonlight checkpoints: loading, weight buckets, and the tiny CPU model."""

from typing import Any

from rlinf.models.hf_checkpoint import (
    SUPPORTED_MODEL_TYPES,
    ModelLoadError,
    load_causal_lm,
    load_model_config,
    load_tokenizer,
)
from rlinf.models.weights import (
    WeightLoadError,
    iter_weight_buckets,
    load_weight_bucket,
    max_weight_diff,
    weights_equal,
)

_TINY_NAMES = ("TinyModelSettings", "build_tiny_checkpoint", "ensure_tiny_checkpoint", "resolve_model_path")


def __getattr__(name: str) -> Any:
    # rlinf.models.tiny is imported on first use rather than here, so that
    # `python -m rlinf.models.tiny` does not find it already imported (runpy warns about that).
    if name in _TINY_NAMES:
        from rlinf.models import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "ModelLoadError",
    "WeightLoadError",
    "iter_weight_buckets",
    "load_causal_lm",
    "load_model_config",
    "load_tokenizer",
    "load_weight_bucket",
    "max_weight_diff",
    "weights_equal",
    *_TINY_NAMES,
]
