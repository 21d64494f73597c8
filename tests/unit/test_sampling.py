import logging
import math

import pytest
import torch
from transformers import DeepseekV3ForCausalLM

from rlinf.config.schema import SamplingConfig
from rlinf.models.logprobs import positions_from_mask, response_logprobs
from rlinf.models.tiny import SMALL_SETTINGS, random_deepseek_v3
from rlinf.workers.rollout.sampling import (
    SamplingParams,
    choose_next_tokens,
    filter_logits,
    sample,
)

torch.set_num_threads(2)
PAD, EOS = 0, 2
# Different lengths, so the batch is left-padded.
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [20], [30, 31, 32, 33], [40, 41]]


def tiny_deepseek_v3(eos_bias: float | None = None, seed: int = 0) -> DeepseekV3ForCausalLM:
    """Random tiny DeepSeek-V3; `eos_bias` adds an lm_head bias on EOS to steer when rows stop."""
    # initializer_range 0.2: peaked distributions, so greedy paths and wrong positions are distinct.
    model = random_deepseek_v3(
        SMALL_SETTINGS, vocab_size=64, seed=seed, pad_token_id=PAD, eos_token_id=EOS, initializer_range=0.2
    )
    if eos_bias is not None:
        biased_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
        with torch.no_grad():
            biased_head.weight.copy_(model.lm_head.weight)
            biased_head.bias.zero_()
            biased_head.bias[EOS] = eos_bias
        model.lm_head = biased_head
    return model


def run(model, params: SamplingParams, prompts=PROMPTS, seed: int = 0, **kwargs):
    generator = torch.Generator().manual_seed(seed)
    return sample(
        model, prompts, params, eos_token_ids=[EOS], pad_token_id=PAD, generator=generator, **kwargs
    )


def recompute(model, out, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logprobs, _ = response_logprobs(
            model,
            out.prompt_ids,
            out.prompt_mask,
            out.response_ids,
            out.response_mask,
            temperature=temperature,
        )
    return logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_equal_recomputed_logprobs(temperature):
    # EOS is likely enough that rows stop at different steps, so finished rows leave the batch mid-way.
    model = tiny_deepseek_v3(eos_bias=1.5)
    prompts = PROMPTS * 3
    out = run(model, SamplingParams(temperature=temperature, max_new_tokens=16), prompts=prompts)

    assert {"stop", "length"} <= set(out.finish_reasons)
    assert out.prompt_ids.shape[0] == len(prompts)
    max_diff = (out.logprobs - recompute(model, out, temperature)).abs().max().item()
    print(f"temperature {temperature}: max |rollout - recomputed| logprob = {max_diff:.2e}")
    assert max_diff < 1e-4
    assert (out.logprobs[~out.response_mask] == 0).all()


def greedy_reference(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """No cache, no padding: a full forward over the whole sequence at every step."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            next_token = int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax())
            tokens.append(next_token)
            if next_token == EOS:
                break
    return tokens[len(prompt) :]


def responses(out) -> list[list[int]]:
    return [ids[mask].tolist() for ids, mask in zip(out.response_ids, out.response_mask, strict=True)]


def test_greedy_equals_reference_decoder_without_cache():
    model = tiny_deepseek_v3(eos_bias=2.0)
    out = run(model, SamplingParams(greedy=True, max_new_tokens=16))
    expected = [greedy_reference(model, p, 16) for p in PROMPTS]
    assert responses(out) == expected
    assert out.finish_reasons == ["stop" if r[-1] == EOS else "length" for r in expected]
    torch.testing.assert_close(out.logprobs, recompute(model, out, temperature=1.0), atol=1e-4, rtol=0)


def test_greedy_output_does_not_depend_on_batch_padding():
    model = tiny_deepseek_v3()
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    alone = run(model, params, prompts=[PROMPTS[2]])
    batched = run(model, params, prompts=[PROMPTS[1], PROMPTS[2], [50] * 12])
    assert responses(alone)[0] == responses(batched)[1]
    torch.testing.assert_close(alone.logprobs[0], batched.logprobs[1], atol=1e-5, rtol=0)


def test_chunks_are_padded_to_common_widths():
    model = tiny_deepseek_v3(eos_bias=2.0)
    params = SamplingParams(greedy=True, max_new_tokens=10)
    whole = run(model, params)
    chunked = run(model, params, max_batch_size=2)
    assert torch.equal(chunked.prompt_ids, whole.prompt_ids)
    assert torch.equal(chunked.prompt_mask, whole.prompt_mask)
    assert torch.equal(chunked.response_ids, whole.response_ids)
    assert torch.equal(chunked.response_mask, whole.response_mask)
    assert chunked.finish_reasons == whole.finish_reasons
    torch.testing.assert_close(chunked.logprobs, whole.logprobs, atol=1e-5, rtol=0)


def test_same_seed_same_samples_different_seed_different_samples():
    model = tiny_deepseek_v3()
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    first, again, other = run(model, params, seed=1), run(model, params, seed=1), run(model, params, seed=2)
    assert torch.equal(first.response_ids, again.response_ids)
    assert torch.equal(first.logprobs, again.logprobs)
    assert not torch.equal(first.response_ids, other.response_ids)


def test_top_k_one_equals_greedy():
    model = tiny_deepseek_v3(eos_bias=2.0)
    greedy = run(model, SamplingParams(greedy=True, max_new_tokens=12))
    top_one = run(model, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=12))
    assert torch.equal(top_one.response_ids, greedy.response_ids)
    assert torch.equal(top_one.logprobs, greedy.logprobs)


def test_eos_stops_a_row_and_is_part_of_the_response():
    model = tiny_deepseek_v3(eos_bias=50.0)
    out = run(model, SamplingParams(max_new_tokens=8))
    assert out.response_ids.tolist() == [[EOS]] * len(PROMPTS)
    assert out.response_mask.all()
    assert out.finish_reasons == ["stop"] * len(PROMPTS)


def test_min_new_tokens_masks_eos_until_reached():
    model = tiny_deepseek_v3(eos_bias=50.0)
    out = run(model, SamplingParams(max_new_tokens=8, min_new_tokens=5))
    assert out.response_mask.sum(1).tolist() == [6] * len(PROMPTS)
    assert (out.response_ids[:, :5] != EOS).all()
    assert (out.response_ids[:, 5] == EOS).all()
    assert out.finish_reasons == ["stop"] * len(PROMPTS)
    # The blocked EOS keeps its mass in the reported (full-distribution) logprobs.
    assert (out.logprobs[:, :5] < -40).all()
    torch.testing.assert_close(out.logprobs, recompute(model, out, temperature=1.0), atol=1e-4, rtol=0)


def test_max_new_tokens_bounds_the_response_and_reports_length():
    model = tiny_deepseek_v3(eos_bias=-50.0)
    out = run(model, SamplingParams(max_new_tokens=7))
    assert out.response_ids.shape == (len(PROMPTS), 7)
    assert out.response_mask.all()
    assert out.finish_reasons == ["length"] * len(PROMPTS)


def test_outputs_feed_training_and_model_mode_is_restored():
    model = tiny_deepseek_v3().train()
    out = run(model, SamplingParams(max_new_tokens=4))
    assert model.training
    logprobs, _ = response_logprobs(
        model, out.prompt_ids, out.prompt_mask, out.response_ids, out.response_mask
    )
    logprobs.sum().backward()
    assert model.lm_head.weight.grad.abs().sum() > 0


def test_from_config_copies_fields():
    config = SamplingConfig(temperature=0.6, top_p=0.9, top_k=20, max_new_tokens=64, min_new_tokens=2)
    params = SamplingParams.from_config(config, greedy=True)
    assert params == SamplingParams(0.6, 0.9, 20, 64, 2, greedy=True)
    assert params.logprob_temperature == 1.0
    assert SamplingParams.from_config(config).logprob_temperature == 0.6


def test_filter_logits_hand_values():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    kept = lambda filtered: torch.isfinite(filtered[0]).nonzero().squeeze(-1).tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2, top_p=1.0)) == [1, 2]
    assert kept(filter_logits(logits, top_k=-1, top_p=1.0)) == [0, 1, 2, 3]

    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3], [0.25, 0.25, 0.25, 0.25]])
    log_probs = probs.log()
    filtered = filter_logits(log_probs, top_k=-1, top_p=0.7)
    assert torch.isfinite(filtered).tolist() == [[False, True, False, True], [True, True, True, False]]
    assert kept(filter_logits(log_probs, top_k=-1, top_p=0.9)) == [0, 1, 3]
    assert kept(filter_logits(log_probs, top_k=-1, top_p=0.01)) == [1]
    assert kept(filter_logits(log_probs, top_k=2, top_p=0.95)) == [1, 3]
    # Kept logits are left untouched (renormalisation is the softmax's job).
    assert filtered[0, 1] == log_probs[0, 1]


def test_top_p_samples_stay_in_the_nucleus_with_renormalised_frequencies():
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])
    logits = probs.log().expand(20000, -1)
    params = SamplingParams(temperature=1.0, top_p=0.7)
    tokens, logprobs = choose_next_tokens(logits, params, generator=torch.Generator().manual_seed(0))

    counts = torch.bincount(tokens, minlength=4)
    assert counts[0] == 0 and counts[2] == 0
    assert counts[1] / len(tokens) == pytest.approx(0.5 / 0.8, abs=0.02)
    # Reported logprobs are of the full distribution, not of the renormalised nucleus.
    torch.testing.assert_close(logprobs, probs.log()[tokens])


def test_temperature_sharpens_the_sampling_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(20000, -1)
    tokens, logprobs = choose_next_tokens(
        logits, SamplingParams(temperature=0.5), generator=torch.Generator().manual_seed(0)
    )
    sharpened = probs**2 / (probs**2).sum()
    frequencies = torch.bincount(tokens, minlength=3) / len(tokens)
    torch.testing.assert_close(frequencies, sharpened, atol=0.02, rtol=0)
    torch.testing.assert_close(logprobs, sharpened.log()[tokens])


def test_blocked_ids_are_never_chosen():
    logits = torch.tensor([[0.0, 10.0, 0.0]]).expand(1000, -1)
    blocked = torch.tensor([1])
    greedy_tokens, greedy_logprobs = choose_next_tokens(
        logits, SamplingParams(greedy=True), blocked_ids=blocked
    )
    sampled, _ = choose_next_tokens(
        logits, SamplingParams(), generator=torch.Generator().manual_seed(0), blocked_ids=blocked
    )
    assert (greedy_tokens != 1).all() and (sampled != 1).all()
    assert greedy_logprobs[0] == pytest.approx(-10.0 - math.log1p(2 * math.exp(-10.0)), abs=1e-5)


@pytest.mark.parametrize(
    "bad",
    [
        dict(temperature=-0.1),
        dict(top_p=0.0),
        dict(top_k=0),
        dict(max_new_tokens=0),
        dict(max_new_tokens=4, min_new_tokens=5),
    ],
)
def test_invalid_params_are_rejected(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


# --- Logprob convention (docs/rollout.md): reported = untruncated tempered logprob, never the
# probability the token was drawn with under top-k / top-p; the validator warns when that differs.


def test_top_k_reports_untruncated_logprob_not_the_behaviour_probability():
    probs = torch.tensor([0.4, 0.25, 0.15, 0.12, 0.08])
    logits = probs.log().expand(40000, -1)
    tokens, reported = choose_next_tokens(
        logits, SamplingParams(temperature=1.0, top_k=3), generator=torch.Generator().manual_seed(0)
    )
    kept_mass = probs[:3].sum()  # Z = 0.8
    behaviour = torch.where(torch.arange(5) < 3, probs / kept_mass, torch.zeros(5))

    # Tokens really are drawn from the truncated, renormalised distribution ...
    frequencies = torch.bincount(tokens, minlength=5) / len(tokens)
    torch.testing.assert_close(frequencies, behaviour, atol=0.01, rtol=0)
    # ... but the reported logprob is of the untruncated one, off by log Z for every sample.
    torch.testing.assert_close(reported, probs.log()[tokens])
    gap = behaviour.log()[tokens] - reported
    torch.testing.assert_close(gap, torch.full_like(gap, -math.log(kept_mass.item())))
    assert -math.log(kept_mass.item()) > 0.2


def test_top_k_rollout_matches_the_actor_recompute_not_the_behaviour_logprob():
    model = tiny_deepseek_v3()
    out = run(model, SamplingParams(temperature=0.8, top_k=3, max_new_tokens=12), prompts=PROMPTS * 2)
    mask = out.response_mask
    recomputed = recompute(model, out, temperature=0.8)
    assert (out.logprobs - recomputed).abs().max() < 1e-4

    # The true behaviour logprob: the recomputed full logits truncated to their top 3, renormalised.
    with torch.no_grad():
        ids = torch.cat([out.prompt_ids, out.response_ids], 1)
        attn = torch.cat([out.prompt_mask, mask], 1)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=positions_from_mask(attn)).logits[
            :, out.prompt_ids.shape[1] - 1 : -1
        ]
        scaled = logits.float() / 0.8
        behaviour = filter_logits(scaled, top_k=3, top_p=1.0).log_softmax(-1)
        behaviour = behaviour.gather(-1, out.response_ids.unsqueeze(-1)).squeeze(-1)
    assert torch.isfinite(behaviour[mask]).all()  # every sampled token is inside its top 3
    gap = (behaviour - out.logprobs)[mask]
    print(f"top_k=3: mean log(behaviour / reported) = {gap.mean():.3f}")
    assert (gap > 0).all() and gap.mean() > 0.05


def test_validator_warns_once_naming_the_truncation_keys(caplog):
    from rlinf.config import validate as validate_module
    from rlinf.config.loader import load_config

    validate_module._warned_sampling.clear()
    with caplog.at_level(logging.WARNING, logger="rlinf.config.validate"):
        load_config("tiny-moe-grpo-cpu")
        assert not caplog.records  # the tiny recipe samples untruncated: nothing to warn about
        overrides = ["algorithm.sampling_params.top_k=3", "algorithm.sampling_params.top_p=0.9"]
        load_config("tiny-moe-grpo-cpu", overrides)
        load_config("tiny-moe-grpo-cpu", overrides)
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "algorithm.sampling_params.top_k=3" in message
    assert "algorithm.sampling_params.top_p=0.9" in message
    assert "min_new_tokens" not in message


def test_decoding_on_cuda_never_uses_cudnn_attention_and_restores_the_flags():
    from rlinf.workers.rollout.sampling import decode_attention_kernels

    assert torch.backends.cuda.cudnn_sdp_enabled()
    with decode_attention_kernels(torch.device("cuda", 0)):
        assert not torch.backends.cuda.cudnn_sdp_enabled()  # a plan build per new shape
        assert torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with decode_attention_kernels(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled()  # nothing changes off CUDA


def test_sample_decodes_inside_the_attention_kernel_choice_for_its_device(monkeypatch):
    import contextlib

    from rlinf.workers.rollout import sampling

    seen = []

    @contextlib.contextmanager
    def recording(device):
        seen.append(torch.device(device))
        yield

    monkeypatch.setattr(sampling, "decode_attention_kernels", recording)
    out = run(tiny_deepseek_v3(), SamplingParams(temperature=1.0, max_new_tokens=3))
    assert seen == [torch.device("cpu")]
    assert out.response_ids.shape == (len(PROMPTS), 3)
