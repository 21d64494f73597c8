"""Recipe -> SGLang engine arguments, sampling dicts and output parsing (no sglang needed)."""

from dataclasses import replace

import pytest
import torch

from rlinf.config import ConfigError, load_config
from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.sglang_args import (
    EngineOutputError,
    check_expert_parallel,
    engine_kwargs,
    engine_spans,
    parse_outputs,
    request_seeds,
    sampling_dicts,
)

MOONLIGHT = "examples/reasoning/config/math/moonlight-16b-grpo-megatron.yaml"


# Data paths of this machine; fp32 master weights (what megatron-core offers) whatever the recipe says.
OVERRIDES = [
    "data.train_data_paths=[x.jsonl]",
    "data.val_data_paths=[y.jsonl]",
    "actor.optim.main_params_dtype=fp32",
]


@pytest.fixture(scope="module")
def moonlight():
    return load_config(MOONLIGHT, OVERRIDES)


def test_moonlight_engine_kwargs(moonlight):
    kw = engine_kwargs(moonlight, model_path="/ckpt", colocated=True, needs_tokenizer=False)
    assert kw["model_path"] == "/ckpt"
    assert (kw["tp_size"], kw["ep_size"]) == (8, 8)  # enable_ep_moe -> ep_size = tp_size
    assert kw["mem_fraction_static"] == 0.5
    assert kw["attention_backend"] == "fa3"
    assert kw["cuda_graph_max_bs"] == 256 and kw["disable_cuda_graph"] is False
    assert kw["dtype"] == "bfloat16"
    assert kw["enable_memory_saver"] is True  # colocated
    assert kw["skip_tokenizer_init"] is True
    assert kw["sampling_backend"] == "pytorch" and kw["grammar_backend"] == "none"
    assert kw["disable_piecewise_cuda_graph"] is True
    assert kw["trust_remote_code"] is True
    assert kw["random_seed"] == 1234
    assert "max_running_requests" not in kw  # null: SGLang sizes it
    assert "decode_attention_backend" not in kw and "prefill_attention_backend" not in kw


def test_decode_attention_backend_splits_prefill_and_decode(moonlight):
    s = replace(moonlight.rollout.sglang, attention_backend="triton", decode_attention_backend="flashmla")
    cfg = replace(moonlight, rollout=replace(moonlight.rollout, sglang=s))
    kw = engine_kwargs(cfg, model_path="/ckpt", colocated=True, needs_tokenizer=False)
    # SGLang's hybrid backend: prefill keeps attention_backend, decode takes the other one.
    assert kw["prefill_attention_backend"] == "triton" and kw["decode_attention_backend"] == "flashmla"
    assert kw["attention_backend"] == "triton"


def test_engine_kwargs_follow_the_sglang_keys(moonlight):
    s = replace(
        moonlight.rollout.sglang,
        enable_ep_moe=False,
        attention_backend="triton",
        cuda_graph_max_bs=0,
        max_running_requests=64,
        deterministic_inference=True,
    )
    cfg = replace(moonlight, rollout=replace(moonlight.rollout, sglang=s, gpu_memory_utilization=0.3))
    kw = engine_kwargs(cfg, model_path="/ckpt", colocated=False, needs_tokenizer=True)
    assert kw["ep_size"] == 1 and kw["tp_size"] == 8
    assert kw["attention_backend"] == "triton" and kw["mem_fraction_static"] == 0.3
    assert kw["disable_cuda_graph"] is True and "cuda_graph_max_bs" not in kw
    assert kw["max_running_requests"] == 64
    assert kw["enable_deterministic_inference"] is True
    assert kw["enable_memory_saver"] is False  # disaggregated: nothing to hand over
    assert kw["skip_tokenizer_init"] is False  # min_new_tokens needs SGLang's tokenizer


def test_sampling_dicts_map_every_param_and_seed_each_request():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=33, min_new_tokens=2)
    dicts = sampling_dicts(params, [7, 3], [11, 12, 13])
    assert len(dicts) == 3
    assert [d["sampling_seed"] for d in dicts] == [11, 12, 13]
    first = dicts[0]
    assert (first["temperature"], first["top_p"], first["top_k"]) == (0.7, 0.9, 20)
    assert (first["max_new_tokens"], first["min_new_tokens"]) == (33, 2)
    assert first["stop_token_ids"] == [3, 7]


def test_greedy_is_temperature_zero_without_truncation():
    greedy = replace(SamplingParams(temperature=0.7, top_p=0.5, top_k=4), greedy=True)
    (d,) = sampling_dicts(greedy, [1], [0])
    assert (d["temperature"], d["top_p"], d["top_k"]) == (0.0, 1.0, -1)


def test_request_seeds_differ_per_request_and_repeat_per_step():
    seeds = request_seeds(1234, 64)
    assert len(set(seeds)) == 64  # never the shared default (42) for all samples
    assert seeds == request_seeds(1234, 64)  # a resumed run draws the same
    assert set(seeds).isdisjoint(request_seeds(1235, 64))
    assert all(0 <= s < 2**31 for s in seeds)


def _reply(ids, logprobs, reason="stop"):
    return {
        "output_ids": ids,
        "meta_info": {
            "finish_reason": {"type": reason, "matched": ids[-1]} if reason == "stop" else {"type": reason},
            "output_token_logprobs": [(lp, t, None) for lp, t in zip(logprobs, ids, strict=True)],
        },
    }


def test_parse_outputs_layout():
    prompts = [[5, 6, 7], [8]]
    outs = [_reply([1, 2, 0], [-0.1, -0.2, -0.3]), _reply([4], [-1.5], "length")]
    p = parse_outputs(outs, prompts, pad_token_id=9)
    assert p.prompt_ids.tolist() == [[5, 6, 7], [9, 9, 8]]  # left-padded
    assert p.prompt_mask.tolist() == [[True] * 3, [False, False, True]]
    assert p.response_ids.tolist() == [[1, 2, 0], [4, 9, 9]]  # right-padded, stop token kept
    assert p.response_mask.tolist() == [[True] * 3, [True, False, False]]
    assert torch.allclose(p.logprobs, torch.tensor([[-0.1, -0.2, -0.3], [-1.5, 0, 0]]))
    assert p.logprobs.dtype == torch.float32
    assert p.finish_reasons == ["stop", "length"]


def test_parse_outputs_rejects_misaligned_or_aborted_replies():
    bad_ids = _reply([1, 2], [-0.1, -0.2])
    bad_ids["meta_info"]["output_token_logprobs"][1] = (-0.2, 99, None)
    with pytest.raises(EngineOutputError, match="request 0: output_token_logprobs token ids differ"):
        parse_outputs([bad_ids], [[1]], 0)
    short = _reply([1, 2], [-0.1, -0.2])
    short["meta_info"]["output_token_logprobs"].pop()
    with pytest.raises(EngineOutputError, match="1 output_token_logprobs for 2 output_ids"):
        parse_outputs([short], [[1]], 0)
    aborted = _reply([1], [-0.1], "abort")
    aborted["meta_info"]["finish_reason"]["message"] = "out of memory"
    with pytest.raises(EngineOutputError, match="'abort' out of memory"):
        parse_outputs([aborted], [[1]], 0)


def test_engine_spans_split_the_rollout_gpus():
    spans = engine_spans(tuple(range(8, 16)), 4)
    assert [s.gpus for s in spans] == [(8, 9, 10, 11), (12, 13, 14, 15)]
    assert spans[1].local_ids(8) == (4, 5, 6, 7)  # second node's GPUs 4..7
    with pytest.raises(ValueError, match="does not divide"):
        engine_spans((0, 1, 2), 2)


def test_expert_parallel_must_divide_the_experts():
    check_expert_parallel(64, 8, "engine 0")
    with pytest.raises(ValueError, match="engine 0: .* 60 routed experts"):
        check_expert_parallel(60, 8, "engine 0")


def test_validate_refuses_tp_that_does_not_fit_a_node():
    overrides = OVERRIDES
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel_size: 16 \(tensor x expert parallel\)"):
        load_config(MOONLIGHT, [*overrides, "rollout.tensor_parallel_size=16", "cluster.num_nodes=2"])
    # 2 x 6 GPUs: TP 4 divides the 12 but an engine would span two nodes.
    node6 = ["cluster.num_nodes=2", "cluster.num_gpus_per_node=6"]
    actor4 = [  # a valid actor on 12 GPUs: TP 4 x DP 3
        "actor.model.tensor_model_parallel_size=4",
        "actor.model.expert_model_parallel_size=4",
        "data.rollout_batch_size=48",
        "actor.global_batch_size=96",
    ]
    with pytest.raises(ConfigError, match="rollout.tensor_parallel_size: 4 .* the 6 GPU"):
        load_config(MOONLIGHT, [*overrides, *node6, *actor4, "rollout.tensor_parallel_size=4"])
