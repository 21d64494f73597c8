"""HF checkpoint -> megatron-core model through Megatron-Bridge, with the recipe's settings applied.

    bridge, provider = provider_for(model_path, settings, te_available=...)
    model = provider.provide_distributed_model(ddp_config=..., ...)   # loads the HF weights

Trap (megatron-bridge 0.6.2): `to_megatron_provider(load_weights=True)` registers the HF weight
load as the provider's pre-wrap hook. Passing `pre_wrap_hook=` to `provide_distributed_model`
REPLACES that hook and the model keeps its random init; never pass one.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from rlinf.models.megatron import te_placeholder
from rlinf.models.megatron.settings import MegatronSettings

logger = logging.getLogger(__name__)

TORCH_DTYPE_KEYS = (
    "params_dtype",
    "pipeline_dtype",
    "main_params_dtype",
    "main_grads_dtype",
    "exp_avg_dtype",
    "exp_avg_sq_dtype",
)


def import_auto_bridge() -> tuple[Any, bool]:
    """(AutoBridge class, whether the real Transformer Engine is present)."""
    placeholder = te_placeholder.install()
    if placeholder:
        logger.info("Transformer Engine not installed: megatron-bridge imported with the TE placeholder")
    from megatron.bridge import AutoBridge

    return AutoBridge, not placeholder


def with_torch_dtypes(values: dict[str, Any]) -> dict[str, Any]:
    """Settings dict with dtype names ("bfloat16") turned into torch dtypes."""
    import torch

    return {
        k: getattr(torch, v) if k in TORCH_DTYPE_KEYS and isinstance(v, str) else v for k, v in values.items()
    }


def provider_for(
    model_path: str, settings: MegatronSettings, *, te_available: bool, trust_remote_code: bool = False
):
    """(bridge, finalized provider with the HF weight load registered as its pre-wrap hook)."""
    AutoBridge, _ = import_auto_bridge()
    bridge = AutoBridge.from_hf_pretrained(model_path, trust_remote_code=trust_remote_code)
    provider = bridge.to_megatron_provider(load_weights=True)
    for key, value in with_torch_dtypes(settings.provider).items():
        setattr(provider, key, value)
    if not te_available:
        from rlinf.models.megatron.spec import te_free_block_spec

        provider.transformer_layer_spec = functools.partial(
            te_free_block_spec, grouped_experts=settings.grouped_experts
        )
    provider.finalize()
    return bridge, provider
