"""HF checkpoint -> megatron-core model through Megatron-Bridge, with the recipe's settings applied.

    bridge, provider = provider_for(model_path, settings, te_available=...)
    model = provider.provide_distributed_model(ddp_config=..., ...)   # loads the HF weights

The layer spec: with Transformer Engine, rlinf.models.megatron.te_spec (megatron-core's TE spec
without the extra query norm of upstream Megatron-Bridge issues 5261 / 5294); without it, the TE-free
rlinf.models.megatron.spec. `spec_name(te_available)` names the one a build uses.

The HF weight load is strict: megatron-bridge 0.6.2 logs "No mapping found" (or "Can't find ... in
hf_keys") for a parameter no HF tensor fills and then either crashes or leaves it at its random
init; here the build fails instead, naming every such parameter (UnfilledParameterError).

Trap (megatron-bridge 0.6.2): the HF weight load is the provider's pre-wrap hook. Passing
`pre_wrap_hook=` to `provide_distributed_model` REPLACES the registered hooks and the model keeps
its random init; never pass one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rlinf.config.megatron_settings import MegatronSettings
from rlinf.config.run_record import announce, package_version
from rlinf.models.megatron import te_placeholder
from rlinf.models.megatron.fp32_gemms import TF32_WARNING, fp32_gemm_mode

logger = logging.getLogger(__name__)

TE_SPEC = "transformer_engine"
TE_FREE_SPEC = "te_free"


class UnfilledParameterError(RuntimeError):
    """The model has parameters that no HF checkpoint tensor fills (they would keep their random init)."""


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


def spec_name(te_available: bool) -> str:
    return TE_SPEC if te_available else TE_FREE_SPEC


def provider_for(
    model_path: str, settings: MegatronSettings, *, te_available: bool, trust_remote_code: bool = False
):
    """(bridge, finalized provider with the strict HF weight load registered as its pre-wrap hook)."""
    AutoBridge, _ = import_auto_bridge()
    bridge = AutoBridge.from_hf_pretrained(model_path, trust_remote_code=trust_remote_code)
    provider = bridge.to_megatron_provider(load_weights=False)
    provider.perform_initialization = False  # every weight comes from the checkpoint
    provider.register_pre_wrap_hook(functools.partial(load_hf_weights_strictly, bridge))
    for key, value in with_torch_dtypes(settings.provider).items():
        setattr(provider, key, value)
    provider.transformer_layer_spec = layer_spec(settings, te_available=te_available)
    provider.finalize()
    return bridge, provider


def layer_spec(settings: MegatronSettings, *, te_available: bool):
    """The provider's decoder block spec builder: rlinf's TE spec, or the TE-free one."""
    if te_available:
        from rlinf.models.megatron.te_spec import te_block_spec

        return functools.partial(te_block_spec, grouped_experts=settings.grouped_experts)
    from rlinf.models.megatron.spec import te_free_block_spec

    return functools.partial(te_free_block_spec, grouped_experts=settings.grouped_experts)


def load_hf_weights_strictly(bridge, models: list) -> list:
    """The bridge's HF -> megatron load, failing before any copy when a parameter (or persistent
    buffer) of `models` has no HF tensor to come from."""
    model_bridge = bridge._model_bridge  # a fresh DeepSeekV3Bridge (megatron-bridge 0.6.2)
    build_tasks = model_bridge.build_conversion_tasks

    def checked_tasks(hf_pretrained, megatron_model, *args, **kwargs):
        tasks = build_tasks(hf_pretrained, megatron_model, *args, **kwargs)
        # The tasks line up with the bridge's sorted global parameter names (cached by the build).
        # A parameter with no mapping gets no task; one whose HF tensor is missing gets a task with
        # no destination, the same as a parameter that lives on another pipeline rank.
        names = model_bridge._megatron_global_param_names_all_pp_ranks(megatron_model)
        config = megatron_model[0].config
        if model_bridge._share_embeddings_and_output_weights(config):
            names = [n for n in names if "output_layer" not in n]
        if len(names) != len(tasks):
            raise RuntimeError(f"megatron-bridge: {len(tasks)} conversion tasks for {len(names)} parameters")
        local = _local_global_names(model_bridge, megatron_model)
        unfilled = [
            name
            for name, task in zip(names, tasks, strict=True)
            if task is None or (name in local and task.param_weight is None)
        ]
        if unfilled:
            raise UnfilledParameterError(
                f"{len(unfilled)} megatron parameter(s) have no HF tensor in {bridge.hf_pretrained.model_name_or_path} "
                f"(they would keep their random init): {', '.join(unfilled[:8])}"
                + (f" and {len(unfilled) - 8} more" if len(unfilled) > 8 else "")
            )
        return tasks

    model_bridge.build_conversion_tasks = checked_tasks
    return model_bridge.load_weights_hf_to_megatron(bridge.hf_pretrained, models)


def _local_global_names(model_bridge, models: list) -> set[str]:
    """Global names of the parameters and persistent buffers this rank holds (as the bridge names them)."""
    import itertools

    from megatron.bridge.models.conversion.model_bridge import (
        _megatron_local_name_to_global,
        persistent_buffers,
    )

    config = models[0].config
    names = set()
    for vp_stage, model in enumerate(models):
        for local_name, _ in itertools.chain(model.named_parameters(), persistent_buffers(model)):
            if "_extra_state" not in local_name:
                local_name = model_bridge._unwrap_name(local_name)
                names.add(_megatron_local_name_to_global(models, config, local_name, vp_stage))
    return names


@contextmanager
def te_wgrad_fusion_without_apex(provider) -> Iterator[None]:
    """Builds the model with `gradient_accumulation_fusion` in the Transformer Engine layers only.

    TE's linears accumulate weight gradients into megatron's fp32 main_grad themselves. megatron's
    own ColumnParallelLinear (GPTModel.output_layer) refuses the setting at construction unless apex's
    fused_weight_gradient_mlp_cuda is installed, which the GPU stack does not ship. Inside this
    context that check passes, and a pre-wrap hook then turns the fusion off in every non-TE
    megatron linear, so they compute their weight gradient the unfused way."""
    from megatron.core.tensor_parallel import layers

    if not provider.gradient_accumulation_fusion or layers._grad_accum_fusion_available:
        yield
        return
    provider.register_pre_wrap_hook(_unfuse_megatron_linears, prepend=True)
    layers._grad_accum_fusion_available = True
    try:
        yield
    finally:
        layers._grad_accum_fusion_available = False


def _unfuse_megatron_linears(models: list) -> list:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    for model in models:
        for module in model.modules():
            if isinstance(module, ColumnParallelLinear | RowParallelLinear):
                module.gradient_accumulation_fusion = False
    return models


SPEC_RECORD_FILE = "megatron_spec.json"


def spec_record(settings: MegatronSettings, te_available: bool, precision: str = "bf16") -> dict[str, Any]:
    """Which layer spec the actor builds, and the TE features it runs with (an fp32 actor: also
    whether its fp32 GEMMs are exact, rlinf.models.megatron.fp32_gemms)."""
    p = settings.provider
    record: dict[str, Any] = {
        "spec": spec_name(te_available),
        "core_attention": "TEDotProductAttention" if te_available else "SDPACoreAttention",
        "grouped_gemm_experts": bool(p["moe_grouped_gemm"] or settings.grouped_experts),
        "routed_experts": routed_experts(settings, te_available),
        "gradient_accumulation_fusion": bool(p["gradient_accumulation_fusion"]),
        "moe_permute_fusion": bool(p.get("moe_permute_fusion", False)),
        "apply_rope_fusion": bool(p.get("apply_rope_fusion", False)),
    }
    if te_available:
        record["transformer_engine"] = package_version("transformer-engine")
    if precision == "fp32":
        record["fp32_gemms"] = fp32_gemm_mode(te_available)
    return record


def routed_experts(settings: MegatronSettings, te_available: bool) -> str:
    """The module that computes the MoE layers' routed experts in this build."""
    if settings.grouped_experts:
        return "GroupedGemmExperts"  # rlinf's, torch grouped_mm (either spec)
    return "TEGroupedMLP" if te_available else "SequentialMLP"


def announce_spec(
    settings: MegatronSettings, te_available: bool, log_dir: str | None, precision: str = "bf16"
) -> dict[str, Any]:
    """Prints which spec this run uses (call once, on one rank) and writes it next to the run's
    resolved config (`log_dir`/megatron_spec.json) when the run has a logs folder."""
    record = spec_record(settings, te_available, precision)
    if record.get("fp32_gemms") == "tf32":
        logger.warning(TF32_WARNING)
    return announce("megatron actor: layer spec", record, log_dir, SPEC_RECORD_FILE)
