"""benchmarks/rollout_decode.py refuses a malformed --sglang-variants before it measures anything."""

import pytest

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
