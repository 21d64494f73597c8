"""A benchmark run's Megatron settings and variants (benchmarks/actor_throughput.py's
`--megatron-setting` and `--megatron-variants`, the GPU checks' knobs): parsed from `key=value`
text, and applied to the Megatron actors built inside `provider_overrides`. A key of `actor.model`
changes the recipe before megatron_settings.translate() reads it; `micro_batch_size` /
`logprob_micro_batch_size` change the rows of a forward; any other key is the provider setting it
names."""

from __future__ import annotations

import contextlib
from dataclasses import fields, replace
from unittest import mock

from rlinf.config.schema import ActorConfig, ModelConfig

MODEL_KEYS = frozenset(f.name for f in fields(ModelConfig))
# actor keys a variant may change besides actor.model's: the rows of a train / logprob forward
BATCH_KEYS = frozenset({"micro_batch_size", "logprob_micro_batch_size"})


def with_model_keys(actor: ActorConfig, overrides: dict) -> ActorConfig:
    """`actor` with the overrides that name `actor.model` keys or the rows of a forward (BATCH_KEYS;
    the others name provider settings):
    translate() reads them, and the Megatron actor reads some itself (cuda_graph_impl: its graphs and
    fixed micro-batch shape)."""
    model = {k: v for k, v in overrides.items() if k in MODEL_KEYS}
    rows = {k: v for k, v in overrides.items() if k in BATCH_KEYS}
    return replace(actor, model=replace(actor.model, **model), **rows)


def provider_overrides(overrides: dict) -> contextlib.AbstractContextManager:
    """Megatron actors built inside get `overrides` on top of the recipe's settings: a key of
    `actor.model` (e.g. moe_grouped_gemm_impl) changes the recipe before the translation, any
    other key the provider setting it names."""
    import rlinf.config.megatron_settings as settings

    translate = settings.translate
    provider = {k: v for k, v in overrides.items() if k not in MODEL_KEYS | BATCH_KEYS}

    def with_overrides(actor, *, te_available):
        translated = translate(with_model_keys(actor, overrides), te_available=te_available)
        return replace(translated, provider={**translated.provider, **provider})

    return mock.patch.object(settings, "translate", with_overrides)


def parse_setting(text: str) -> dict:
    """One key=value provider setting. `attention_backend` names megatron-core's AttnBackend (flash,
    fused, unfused, local, auto): with TE it picks TE's core attention kernel (megatron-core turns it
    into the NVTE_*_ATTN variables of the process, and refuses them set any other way)."""
    key, _, value = (part.strip() for part in text.partition("="))
    if key == "cuda_graph_modules":  # a list: "+" joins its items (a comma separates variants)
        return {key: tuple(value.split("+"))}
    if key in BATCH_KEYS:
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"{text}: {key} takes a number of rows (>= 1)")
        return {key: int(value)}
    if key == "attention_backend":
        from megatron.core.transformer.enums import AttnBackend

        if value not in AttnBackend.__members__:
            raise SystemExit(f"{text}: attention_backend is one of {list(AttnBackend.__members__)}")
        return {key: AttnBackend[value]}
    return {key: {"true": True, "false": False}.get(value.lower(), value)}


def parse_variant(text: str) -> dict:
    """One `--megatron-variants` entry: a second actor in this process with this setting (several
    joined by ";", e.g. cuda_graph_impl=transformer_engine;cuda_graph_modules=moe_router+moe_preprocess)."""
    setting = {k: v for part in text.split(";") for k, v in parse_setting(part).items()}
    if "attention_backend" in setting:  # the first actor has fixed the process's NVTE_*_ATTN
        raise SystemExit(
            f"--megatron-variants {text}: one attention backend per process; use --megatron-setting"
        )
    return setting
