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
