import math
from types import SimpleNamespace

import pytest
import torch
from transformers import DeepseekV3ForCausalLM

from rlinf.models.logprobs import positions_from_mask, reference_response_logprobs, response_logprobs
from rlinf.models.tiny import SMALL_SETTINGS, random_deepseek_v3

torch.set_num_threads(2)
PAD = 0


def tiny_deepseek_v3(seed: int = 0) -> DeepseekV3ForCausalLM:
    # initializer_range 0.2: peaked distributions, so wrong positions show up in the logprobs.
    return random_deepseek_v3(
        SMALL_SETTINGS, vocab_size=64, seed=seed, pad_token_id=PAD, initializer_range=0.2
    )


class BigramLM(torch.nn.Module):
    """Logits depend only on the current token: hand-checkable, and any off-by-one shows."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids, position_ids, logits_to_keep=0, **_):
        self.seen_position_ids = position_ids
        return SimpleNamespace(logits=self.table[input_ids][:, -logits_to_keep:])


def left_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    return ids, mask


def right_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    mask = torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])
    return ids, mask


def test_positions_ignore_left_padding():
    mask = torch.tensor([[False, False, True, True, True, False], [True, True, True, True, True, True]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2, 2], [0, 1, 2, 3, 4, 5]]


def test_bigram_logprobs_and_entropy_match_hand_computation():
    table = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, -1.0], [0.5, 1.5, 0.0]])
    model = BigramLM(table)
    prompt_ids, prompt_mask = left_pad([[1], [2, 1]])
    response_ids, response_mask = right_pad([[2, 1], [0]])
    temperature = 0.5

    logprobs, entropy = response_logprobs(
        model,
        prompt_ids,
        prompt_mask,
        response_ids,
        response_mask,
        temperature=temperature,
        with_entropy=True,
    )

    def hand(prev: int, token: int) -> tuple[float, float]:
        z = [x / temperature for x in table[prev].tolist()]
        log_norm = math.log(sum(math.exp(v) for v in z))
        logp = [v - log_norm for v in z]
        return logp[token], -sum(math.exp(lp) * lp for lp in logp)

    # row 0: prompt [1] -> 2 (predicted from 1), then 1 (predicted from 2); row 1: prompt [2, 1] -> 0.
    expected = [[hand(1, 2), hand(2, 1)], [hand(1, 0), (0.0, 0.0)]]
    expected_logprobs = torch.tensor([[lp for lp, _ in row] for row in expected])
    expected_entropy = torch.tensor([[h for _, h in row] for row in expected])
    torch.testing.assert_close(logprobs, expected_logprobs, atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy, expected_entropy, atol=1e-6, rtol=0)
    # Each row counts positions from its first real token (RoPE alone would hide a constant shift).
    assert model.seen_position_ids.tolist() == [[0, 0, 1, 2], [0, 1, 2, 2]]


def test_matches_naive_full_forward_on_unpadded_rows():
    model = tiny_deepseek_v3()
    prompts = [[3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13]]
    responses = [[20, 21, 22], [23, 24, 25, 26, 27], [28]]
    prompt_ids, prompt_mask = left_pad(prompts)
    response_ids, response_mask = right_pad(responses)

    with torch.no_grad():
        logprobs, _ = response_logprobs(
            model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=0.7
        )
        for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            full = torch.tensor([prompt + response])
            all_logprobs = (model(input_ids=full).logits[0].float() / 0.7).log_softmax(-1)
            naive = all_logprobs[len(prompt) - 1 : -1].gather(-1, full[0, len(prompt) :, None]).squeeze(-1)
            n = len(response)
            torch.testing.assert_close(logprobs[row, :n], naive, atol=1e-5, rtol=0)
            assert (logprobs[row, n:] == 0).all()


def test_non_positive_temperature_reports_temperature_one():
    model = tiny_deepseek_v3()
    prompt_ids, prompt_mask = left_pad([[3, 4], [5]])
    response_ids, response_mask = right_pad([[6, 7], [8, 9]])
    with torch.no_grad():
        at_one, _ = response_logprobs(
            model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=1.0
        )
        at_zero, _ = response_logprobs(
            model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=0.0
        )
        at_half, _ = response_logprobs(
            model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=0.5
        )
    assert torch.equal(at_one, at_zero)
    assert not torch.allclose(at_one, at_half)


def test_gradients_flow_to_all_layers_from_logprobs_and_entropy():
    model = tiny_deepseek_v3().train()
    prompt_ids, prompt_mask = left_pad([[3, 4, 5], [6]])
    response_ids, response_mask = right_pad([[7, 8], [9, 10, 11]])
    logprobs, entropy = response_logprobs(
        model, prompt_ids, prompt_mask, response_ids, response_mask, with_entropy=True
    )
    names = ("model.embed_tokens.weight", "model.layers.0.self_attn.kv_b_proj.weight", "lm_head.weight")
    params = [model.get_parameter(name) for name in names]
    for output in (logprobs, entropy):
        grads = torch.autograd.grad(output.sum(), params, retain_graph=True)
        for name, grad in zip(names, grads, strict=True):
            assert grad.abs().sum() > 0, name


def _padded_batch():
    prompt_ids, prompt_mask = left_pad([[3, 4, 5, 6], [9], [11, 12]])
    response_ids, response_mask = right_pad([[20, 21, 22, 23, 24], [25, 26], [27, 28, 29]])
    return prompt_ids, prompt_mask, response_ids, response_mask


@pytest.mark.parametrize("chunk_tokens,temperature", [(1, 0.7), (3, 1.0), (None, 0.7), (None, 0.0)])
def test_chunked_logprobs_equal_the_unchunked_full_vocab_reference(chunk_tokens, temperature):
    model = tiny_deepseek_v3()
    batch = _padded_batch()
    with torch.no_grad():
        expected, expected_entropy = reference_response_logprobs(model, *batch, temperature=temperature)
        got, entropy = response_logprobs(
            model, *batch, temperature=temperature, with_entropy=True, chunk_tokens=chunk_tokens
        )
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)
    torch.testing.assert_close(entropy, expected_entropy, atol=2e-6, rtol=0)
    assert (got[~batch[3]] == 0).all() and (entropy[~batch[3]] == 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_gradients_equal_the_unchunked_reference_gradients(temperature):
    model = tiny_deepseek_v3().train()
    batch = _padded_batch()
    weights = torch.linspace(0.5, 1.5, batch[2].numel()).view(batch[2].shape)

    def grads(logprobs_fn, **kwargs):
        model.zero_grad(set_to_none=True)
        logprobs, entropy = logprobs_fn(model, *batch, temperature=temperature, **kwargs)
        ((logprobs * weights).sum() + 0.3 * entropy.sum()).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    expected = grads(reference_response_logprobs)
    got = grads(response_logprobs, with_entropy=True, chunk_tokens=2)
    assert got.keys() == expected.keys() and "lm_head.weight" in got
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)


def test_default_chunk_bounds_the_fp32_logits_of_a_large_vocab(monkeypatch):
    # With 2**10 fp32 logits per chunk and a 64-token vocabulary, every fp32 chunk holds 16 rows,
    # in the forward and again in the backward.
    import rlinf.models.logprobs as logprobs_module

    monkeypatch.setattr(logprobs_module, "CHUNK_LOGITS", 2**10)
    seen = []
    real = logprobs_module._tempered_log_softmax
    monkeypatch.setattr(
        logprobs_module, "_tempered_log_softmax", lambda x, t: seen.append(x.shape[0]) or real(x, t)
    )
    model = tiny_deepseek_v3()
    prompt_ids, prompt_mask = left_pad([[3, 4]] * 5)
    response_ids, response_mask = right_pad([list(range(10, 18))] * 5)
    logprobs, _ = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask)
    assert seen == [16, 16, 8]
    logprobs.sum().backward()
    assert seen == [16, 16, 8] * 2


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_forward_equals_the_padded_one_values_and_gradients(temperature):
    from rlinf.models.logprobs import pack_rows

    model = tiny_deepseek_v3().train()
    batch = _padded_batch()
    weights = torch.linspace(0.5, 1.5, batch[2].numel()).view(batch[2].shape)

    def run(**kwargs):
        model.zero_grad(set_to_none=True)
        logprobs, entropy = response_logprobs(
            model, *batch, temperature=temperature, with_entropy=True, **kwargs
        )
        ((logprobs * weights).sum() + 0.3 * entropy.sum()).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return logprobs.detach(), entropy.detach(), grads

    padded, packed = run(), run(packed=True)
    for want, got in zip(padded[:2], packed[:2], strict=True):
        torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    assert packed[2].keys() == padded[2].keys()
    for name in padded[2]:
        torch.testing.assert_close(packed[2][name], padded[2][name], atol=1e-5, rtol=1e-4, msg=name)
    # the packed row is the 17 real tokens, and the sequence boundaries are what keeps them apart:
    # the same row read as one long sequence gives other logprobs
    prompt_ids, prompt_mask, response_ids, response_mask = batch
    kwargs, _ = pack_rows(
        torch.cat([prompt_ids, response_ids], 1), torch.cat([prompt_mask, response_mask], 1)
    )
    assert kwargs["input_ids"].shape == (1, 17) and kwargs["position_ids"][0, :6].tolist() == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]
    with torch.no_grad():
        joined = model(input_ids=kwargs["input_ids"], position_ids=torch.arange(17)[None]).logits
        apart = model(**kwargs).logits
    assert (joined[0, 9:] - apart[0, 9:]).abs().max() > 1e-2  # rows 2 and 3 see row 1 when joined


def test_packed_forward_refuses_a_response_with_a_gap():
    batch = list(_padded_batch())
    batch[3] = batch[3].clone()
    batch[3][0, 2] = False  # row 0's response token 2 masked, token 3 real
    with pytest.raises(ValueError, match="no gaps"):
        response_logprobs(tiny_deepseek_v3(), *batch, packed=True)
