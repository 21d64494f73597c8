"""SGLang's routed-experts output -> RolloutBatch.prompt_experts / response_experts (no sglang import).

With the engine flag `enable_return_routed_experts` and a request's `return_routed_experts=True`,
SGLang 0.5.12 puts `meta_info["routed_experts"]` in each reply: base64 of an int32 array of shape
[seqlen - 1, num_hidden_layers, num_experts_per_tok] (srt/state_capturer/routed_experts.py). Its
rows are the tokens the engine fed through the model: the prompt, then every output token but the
last (sampled, never fed back), exactly what the torch rollout records. Rows for the dense layers
(the first `first_k_dense_replace`) hold nothing and are dropped.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlinf.models.routing import EXPERT_ID_DTYPE, MAX_EXPERTS


class RoutedExpertsError(RuntimeError):
    """A reply whose routed experts do not fit its tokens (missing, wrong size, out of range)."""


@dataclass(frozen=True)
class EngineRouting:
    """What a reply's array holds: every layer of the checkpoint, `top_k` experts each."""

    num_hidden_layers: int
    first_moe_layer: int  # first_k_dense_replace
    top_k: int
    num_experts: int

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> EngineRouting:
        return cls(
            num_hidden_layers=int(config["num_hidden_layers"]),
            first_moe_layer=int(config.get("first_k_dense_replace", 0) or 0),
            top_k=int(config["num_experts_per_tok"]),
            num_experts=int(config["n_routed_experts"]),
        )


def reply_experts(meta: dict[str, Any], tokens: int, routing: EngineRouting, where: str) -> torch.Tensor:
    """[tokens, MoE layers, top_k] uint8 from one reply's meta_info (`tokens` = prompt + output - 1)."""
    encoded = meta.get("routed_experts")
    if encoded is None:
        raise RoutedExpertsError(
            f"{where}: no meta_info['routed_experts'] (engine flag enable_return_routed_experts and the "
            "request's return_routed_experts must both be on)"
        )
    flat = np.frombuffer(base64.b64decode(encoded), dtype=np.int32)
    per_token = routing.num_hidden_layers * routing.top_k
    if flat.size != tokens * per_token:
        raise RoutedExpertsError(
            f"{where}: routed_experts holds {flat.size} ids, expected {tokens} fed tokens x "
            f"{routing.num_hidden_layers} layers x top-{routing.top_k} = {tokens * per_token}"
        )
    experts = torch.from_numpy(flat.copy()).view(tokens, routing.num_hidden_layers, routing.top_k)
    experts = experts[:, routing.first_moe_layer :]
    if tokens and (int(experts.min()) < 0 or int(experts.max()) >= min(routing.num_experts, MAX_EXPERTS)):
        raise RoutedExpertsError(
            f"{where}: routed expert ids outside 0..{routing.num_experts - 1}: "
            f"{int(experts.min())}..{int(experts.max())}"
        )
    return experts.to(EXPERT_ID_DTYPE)


def routed_experts(
    outputs: Sequence[dict[str, Any]],
    prompt_lengths: Sequence[int],
    response_lengths: Sequence[int],
    prompt_width: int,
    response_width: int,
    routing: EngineRouting,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt_experts [B, P, L, K] left-padded, response_experts [B, R, L, K] right-padded, the
    last real response column 0), uint8, in the layout of the parsed replies."""
    layers = routing.num_hidden_layers - routing.first_moe_layer
    rows = len(outputs)
    prompt = torch.zeros(rows, prompt_width, layers, routing.top_k, dtype=EXPERT_ID_DTYPE)
    response = torch.zeros(rows, response_width, layers, routing.top_k, dtype=EXPERT_ID_DTYPE)
    for i, (out, p, r) in enumerate(zip(outputs, prompt_lengths, response_lengths, strict=True)):
        experts = reply_experts(out["meta_info"], p + r - 1, routing, f"request {i}")
        prompt[i, prompt_width - p :] = experts[:p]
        response[i, : r - 1] = experts[p:]
    return prompt, response
