"""benchmarks/decode_bounds.py: the decode bounds against a hand computation, the response-length
mix, and the tail report of a batch timed per request."""

import json
from pathlib import Path

import pytest

from benchmarks.decode_bounds import decode_bounds, kv_bytes_per_token, response_lengths, tail_report
from benchmarks.rollout_decode import add_run

MOONLIGHT = json.loads(Path("tests/fixtures/moonlight-16b-a3b-config.json").read_text())


def test_mla_kv_cache_per_token_is_latent_plus_rope_key_per_layer():
    # 27 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes (bf16)
    assert kv_bytes_per_token(MOONLIGHT) == 31104
    assert kv_bytes_per_token(MOONLIGHT | {"num_hidden_layers": 4}) == 4 * 576 * 2


def test_bounds_match_a_hand_computation():
    # Batch 256, prompt 256 + 512 new: average context 256 + 256 = 512 tokens, so the KV cache read
    # per step is 256 x 512 x 31104 = 4,076,863,488 bytes (3.797 GiB). 31e9 weight bytes at
    # 4.25 TB/s: 256 x 4.25e12 / 31e9 = 35,096.8 tok/s; with the KV cache
    # 256 x 4.25e12 / 35,076,863,488 = 31,017.6 tok/s.
    bounds = decode_bounds(256, 256, 512, 31e9, 31104, 4.25e12)
    assert bounds == {
        "bound_tokens_per_s": 35096.8,
        "kv_bound_tokens_per_s": 31017.6,
        "kv_read_per_step_GiB": 3.797,
    }
    # Batch 64: KV 64 x 512 x 31104 = 1,019,215,872 bytes; 64 x 4.25e12 / 32,019,215,872 = 8,494.9.
    assert decode_bounds(64, 256, 512, 31e9, 31104, 4.25e12)["kv_bound_tokens_per_s"] == 8494.9


def test_rows_carry_both_fractions():
    entry = {"batch": 256, **decode_bounds(256, 256, 512, 31e9, 31104, 4.25e12), "backends": []}
    add_run(entry, "sglang", 512, seconds=10.0, prefill_seconds=0.78)
    run = entry["backends"][0]
    rate = 256 * 511 / 9.22
    assert run["decode_tokens_per_s"] == round(rate, 1)
    assert run["decode_fraction_of_bound"] == round(rate / 35096.8, 4)
    assert run["decode_fraction_of_kv_bound"] == round(rate / 31017.6, 4)
    assert run["decode_fraction_of_kv_bound"] > run["decode_fraction_of_bound"]


def test_response_lengths_are_seeded_capped_and_right_skewed():
    lengths = response_lengths(4096, 4096, seed=3)
    assert lengths == response_lengths(4096, 4096, seed=3)
    assert min(lengths) >= 1 and max(lengths) == 4096
    ordered = sorted(lengths)
    assert 1200 < ordered[2048] < 1530  # median about 4096 / 3
    assert 0.03 < lengths.count(4096) / len(lengths) < 0.1  # P(z > ln 3 / 0.7) = 5.8% reach the cap


def test_tail_report_by_requests_and_by_groups():
    # 10 requests in groups of 2; finishes 1..10 s. 90% of requests: the 9th finish (9 s), tail 1 s
    # of 10. Groups finish at 2, 4, 6, 8, 10 s; 90% of 5 groups: the 5th (10 s), no tail left.
    finishes = [float(i) for i in range(1, 11)]
    lengths = [100 * i for i in range(1, 11)]
    report = tail_report(finishes, lengths, group_size=2, share=0.9)
    assert report["step_seconds"] == 10.0 and report["new_tokens_total"] == 5500
    assert report["tokens_per_s"] == 550.0
    assert report["seconds_at_90pct_requests"] == 9.0 and report["tail_share_of_step"] == 0.1
    assert report["seconds_at_90pct_groups"] == 10.0 and report["group_tail_share_of_step"] == 0.0
    # 80%: the 8th request (8 s) and the 4th group (8 s): a fifth of the step is tail.
    report = tail_report(finishes[::-1], lengths[::-1], group_size=2, share=0.8)
    assert report["seconds_at_80pct_groups"] == 8.0 and report["group_tail_share_of_step"] == 0.2
    assert report["p80_response"] == 800 and report["longest_response"] == 1000
    with pytest.raises(ValueError, match="groups of 3"):
        tail_report(finishes, lengths, group_size=3, share=0.9)
