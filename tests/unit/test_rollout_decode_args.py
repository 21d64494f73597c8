"""benchmarks/rollout_decode.py: its arguments (malformed ones stop before anything is measured) and its arithmetic."""

import pytest
import torch

from benchmarks.rollout_decode import parse_variants


def test_variants_parse_to_engine_kwargs_and_env():
    text = '{"tuned": {"env": {"SGLANG_MOE_CONFIG_DIR": "/x"}}, "split": {"decode_attention_backend": "flashmla"}}'
    assert parse_variants(text) == {
        "tuned": {"env": {"SGLANG_MOE_CONFIG_DIR": "/x"}},
        "split": {"decode_attention_backend": "flashmla"},
    }
    assert parse_variants("{}") == {}


@pytest.mark.parametrize("text", ["{tuned: {}}", "[1]", '{"tuned": 1}'])
def test_malformed_variants_stop_with_one_message(text):
    with pytest.raises(SystemExit, match="--sglang-variants"):
        parse_variants(text)


def test_decode_rate_is_the_whole_call_minus_the_one_token_call():
    from benchmarks.rollout_decode import add_run

    entry = {"batch": 256, "bound_tokens_per_s": 200_000.0, "backends": []}
    add_run(entry, "sglang", 512, seconds=2.3, prefill_seconds=0.256)
    run = entry["backends"][0]
    assert run["tokens_per_s"] == round(256 * 512 / 2.3, 1)
    # 511 decode steps of 256 tokens in 2.044 s: 4 ms per step.
    assert run["decode_step_ms"] == 4.0
    assert run["decode_tokens_per_s"] == round(256 * 511 / 2.044, 1)
    assert run["decode_fraction_of_bound"] == round(256 * 511 / 2.044 / 200_000, 4)


def test_no_decode_rate_when_the_one_token_call_is_not_faster():
    from benchmarks.rollout_decode import add_run

    entry = {"batch": 4, "bound_tokens_per_s": 10.0, "backends": []}
    add_run(entry, "torch", 8, seconds=0.1, prefill_seconds=0.2)
    assert "decode_tokens_per_s" not in entry["backends"][0]


def test_sdpa_backends_restrict_torch_attention_kernels_inside_the_context():
    from benchmarks.rollout_decode import sdpa_backends

    with sdpa_backends("math")():
        assert torch.backends.cuda.math_sdp_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled()
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()  # restored
    with sdpa_backends(None)():
        assert torch.backends.cuda.cudnn_sdp_enabled()
    with pytest.raises(SystemExit, match="--sdpa-backends: unknown"):
        sdpa_backends("flash,fast")


def _args(**over):
    import argparse

    base = dict(batches="64,256", sglang_attention="triton", sglang_mem_fraction=0.7, sglang_arg=[])
    return argparse.Namespace(**(base | over))


def test_the_benchmark_engine_is_the_rollouts_engine_plus_the_variant():
    import json
    from pathlib import Path

    from benchmarks.rollout_decode import engine_arguments
    from rlinf.workers.rollout import moe_configs

    hf = json.loads(Path("tests/fixtures/moonlight-16b-a3b-config.json").read_text())
    kwargs, env = engine_arguments(Path("/m27"), hf, _args(), {}, {})
    # The rollout's tuned MoE tables (E=64 on one GPU) and sampler plugin reach the default engine.
    assert env == {"SGLANG_MOE_CONFIG_DIR": str(moe_configs.HERE), "RLINF_SGLANG_HOOKS": "1"}
    assert kwargs["attention_backend"] == "triton" and kwargs["mem_fraction_static"] == 0.7
    assert kwargs["cuda_graph_max_bs"] == 256 and kwargs["max_running_requests"] == 256
    assert (kwargs["tp_size"], kwargs["ep_size"]) == (1, 1) and kwargs["sampling_backend"] == "pytorch"
    variant = {"disable_overlap_schedule": True}
    kwargs, env = engine_arguments(
        Path("/m27"),
        hf,
        _args(sglang_arg=["chunked_prefill_size=4096"]),
        variant,
        {"SGLANG_MOE_CONFIG_DIR": None},
    )
    assert env["SGLANG_MOE_CONFIG_DIR"] is None  # null: unset for this engine (SGLang's generic config)
    assert kwargs["disable_overlap_schedule"] is True and kwargs["chunked_prefill_size"] == 4096


def test_a_flashmla_variant_without_the_kernel_is_unavailable_before_any_engine_starts(monkeypatch):
    import json
    from pathlib import Path

    from benchmarks import rollout_decode

    monkeypatch.setattr("rlinf.workers.rollout.sglang_settings.flashmla_kernel", lambda: None)
    monkeypatch.setattr(rollout_decode, "start_sglang", lambda kwargs: pytest.fail("engine started"))
    hf = json.loads(Path("tests/fixtures/moonlight-16b-a3b-config.json").read_text())
    variant = {"decode_attention_backend": "flashmla", "prefill_attention_backend": "triton"}
    with pytest.raises(rollout_decode.VariantUnavailable, match="FlashMLA"):
        rollout_decode.measure_sglang(
            "sglang:flashmla", variant, {}, [256], hf, _args(checkpoint="/m27"), {}, {}
        )


def test_per_request_timing_records_each_requests_end():
    import asyncio

    from benchmarks.rollout_decode import run_sglang_per_request

    class Engine:  # answers after a delay proportional to the request's length
        loop = asyncio.new_event_loop()

        async def async_generate(self, input_ids, sampling_params, return_logprob):
            await asyncio.sleep(0.01 * sampling_params["max_new_tokens"])
            return {"output_ids": [0] * sampling_params["max_new_tokens"]}

    finishes, seconds = run_sglang_per_request([[1], [2], [3]], [30, 1, 10], Engine())
    assert finishes[1] < finishes[2] < finishes[0] <= seconds
    assert 0.28 < finishes[0] < 0.6
