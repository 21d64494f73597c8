"""SGLang's routed-experts replies -> the RolloutBatch routing fields, on hand-made meta_info in the
0.5.12 format (base64 of int32 [prompt + output - 1, num_hidden_layers, top_k]); and the engine flag."""

import base64
from dataclasses import replace

import numpy as np
import pytest
import torch

from rlinf.config.schema import Config, RoutingReplayConfig
from rlinf.workers.rollout.sglang_args import engine_kwargs, parse_outputs
from rlinf.workers.rollout.sglang_routing import EngineRouting, RoutedExpertsError, routed_experts

ROUTING = EngineRouting(num_hidden_layers=3, first_moe_layer=1, top_k=2, num_experts=64)


def _ids(row: int, t: int, layer: int) -> list[int]:
    return [(row * 17 + t * 3 + layer) % 64, (row * 5 + t + 7 * layer + 1) % 64]


def _reply(row: int, prompt: list[int], output: list[int]) -> dict:
    fed = len(prompt) + len(output) - 1
    array = np.array([[_ids(row, t, layer) for layer in range(3)] for t in range(fed)], dtype=np.int32)
    return {
        "output_ids": output,
        "meta_info": {
            "output_token_logprobs": [(-0.5, t, None) for t in output],
            "finish_reason": {"type": "stop"},
            "routed_experts": base64.b64encode(array.tobytes()).decode(),
        },
    }


def test_replies_become_prompt_and_response_experts_in_the_batch_layout():
    prompts = [[5, 6, 7], [8], [9, 10]]
    outputs = [[11, 12], [13, 14, 15, 16], [17]]
    replies = [_reply(i, p, o) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]
    parsed = parse_outputs(replies, prompts, pad_token_id=0)
    prompt, response = routed_experts(
        replies,
        [len(p) for p in prompts],
        [len(o) for o in outputs],
        parsed.prompt_ids.shape[1],
        parsed.response_ids.shape[1],
        ROUTING,
    )
    assert prompt.dtype == response.dtype == torch.uint8
    assert prompt.shape == (3, 3, 2, 2) and response.shape == (3, 4, 2, 2)  # the dense layer 0 dropped
    for i, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        sequence = torch.cat([prompt[i, 3 - len(p) :], response[i, : len(o)]])
        for t in range(len(p) + len(o) - 1):
            assert sequence[t].tolist() == [_ids(i, t, layer) for layer in (1, 2)], (i, t)
        assert bool((sequence[len(p) + len(o) - 1 :] == 0).all()), "the last output token is not routed"
        assert bool((prompt[i, : 3 - len(p)] == 0).all()) and bool((response[i, len(o) :] == 0).all())


def test_a_reply_that_does_not_fit_its_tokens_is_refused():
    reply = _reply(0, [1, 2], [3, 4])
    with pytest.raises(
        RoutedExpertsError, match="holds 18 ids, expected 4 fed tokens x 3 layers x top-2 = 24"
    ):
        routed_experts([reply], [2], [3], 2, 3, ROUTING)
    del reply["meta_info"]["routed_experts"]
    with pytest.raises(RoutedExpertsError, match="enable_return_routed_experts"):
        routed_experts([reply], [2], [2], 2, 2, ROUTING)
    few = replace(ROUTING, num_experts=4)
    with pytest.raises(RoutedExpertsError, match="outside 0..3"):
        routed_experts([_reply(0, [1, 2], [3, 4])], [2], [2], 2, 2, few)


def test_the_engine_returns_routed_experts_only_when_routing_is_recorded():
    cfg = Config()
    assert "enable_return_routed_experts" not in engine_kwargs(cfg, model_path="/m", colocated=False)
    replay = replace(cfg, algorithm=replace(cfg.algorithm, routing_replay=RoutingReplayConfig("measure")))
    assert engine_kwargs(replay, model_path="/m", colocated=False)["enable_return_routed_experts"] is True


def test_routing_from_a_moonlight_config():
    import json
    from pathlib import Path

    config = json.loads(
        (Path(__file__).parents[1] / "fixtures" / "moonlight-16b-a3b-config.json").read_text()
    )
    assert EngineRouting.from_hf_config(config) == EngineRouting(27, 1, 6, 64)
