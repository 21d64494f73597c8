"""Weight buckets: checkpoint names, size bounds, exact round trips, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import DeepseekV3ForCausalLM

from rlinf.models.hf_checkpoint import load_causal_lm
from rlinf.models.tiny import SMALL_SETTINGS as SMALL
from rlinf.models.tiny import tiny_model_config
from rlinf.models.tiny_tokenizer import build_char_tokenizer
from rlinf.models.weights import (
    WeightLoadError,
    checkpoint_tensors,
    iter_weight_buckets,
    load_weight_bucket,
    max_weight_diff,
    weights_equal,
)

torch.set_num_threads(1)  # tiny models: a second thread only adds OpenMP waits on a busy machine

EXPERT = "model.layers.1.mlp.experts"
BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"


def _model(seed: int) -> DeepseekV3ForCausalLM:
    """A small DeepSeek-V3 with every weight and persistent buffer random (the bias included)."""
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(tiny_model_config(SMALL, build_char_tokenizer("0123456789+-= "))).eval()
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.normal_(0, 0.1)
    return model


def _logits(model: DeepseekV3ForCausalLM) -> torch.Tensor:
    input_ids = torch.randint(0, model.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return model(input_ids).logits


def test_names_and_values_are_those_save_pretrained_writes(tmp_path: Path) -> None:
    model = _model(0)
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    ours = dict(checkpoint_tensors(model))
    assert ours.keys() == saved.keys()
    assert all(torch.equal(ours[name], saved[name]) for name in saved)
    assert f"{EXPERT}.7.up_proj.weight" in ours and BIAS in ours


def test_expert_tensors_are_views_not_copies() -> None:
    model = _model(0)
    fused = model.model.layers[1].mlp.experts.gate_up_proj
    gate = dict(checkpoint_tensors(model))[f"{EXPERT}.2.gate_proj.weight"]
    assert gate.data_ptr() == fused[2].data_ptr()


@pytest.mark.parametrize("bucket_bytes", [1, 4096, 100_000, 1 << 30])
def test_buckets_respect_the_bound_and_cover_every_tensor(bucket_bytes: int) -> None:
    model = _model(0)
    buckets = list(iter_weight_buckets(model, bucket_bytes))
    for bucket in buckets:
        sizes = [t.numel() * t.element_size() for _, t in bucket]
        assert sum(sizes) <= bucket_bytes or len(bucket) == 1  # an oversized tensor travels alone
    names = [name for bucket in buckets for name, _ in bucket]
    assert names == [name for name, _ in checkpoint_tensors(model)]
    if bucket_bytes == 1:
        assert all(len(bucket) == 1 for bucket in buckets)
    if bucket_bytes == 1 << 30:
        assert len(buckets) == 1


@pytest.mark.parametrize("bucket_bytes", [1, 3000, 1 << 20])
def test_round_trip_is_exact(bucket_bytes: int) -> None:
    source, target = _model(0), _model(1)
    assert not weights_equal(source, target)
    for bucket in iter_weight_buckets(source, bucket_bytes):
        load_weight_bucket(target, bucket)
    assert weights_equal(source, target) and max_weight_diff(source, target) == 0.0
    for name, tensor in target.state_dict().items():  # fused in-memory tensors, not only the views
        assert torch.equal(tensor, source.state_dict()[name]), name
    assert torch.equal(_logits(source), _logits(target))


def test_round_trip_into_lower_precision(tmp_path: Path) -> None:
    _model(1).save_pretrained(tmp_path)
    source, target = _model(0), load_causal_lm(str(tmp_path), precision="bf16")
    for bucket in iter_weight_buckets(source, 10_000):
        load_weight_bucket(target, bucket)
    assert weights_equal(source, target)
    assert not weights_equal(target, _model(0))  # bf16 values are not the fp32 originals
    assert 0 < max_weight_diff(source, target) < 1e-2
    # The loader keeps the routing bias in fp32 in a bf16 model, so it arrives unrounded.
    assert torch.equal(target.state_dict()[BIAS], source.state_dict()[BIAS])


def test_named_tensor_input_in_checkpoint_format(tmp_path: Path) -> None:
    source, target = _model(0), _model(1)
    source.save_pretrained(tmp_path)
    for bucket in iter_weight_buckets(load_file(tmp_path / "model.safetensors").items(), 50_000):
        load_weight_bucket(target, bucket)
    assert weights_equal(source, target)


def test_unknown_name_is_an_error_unless_lenient() -> None:
    model, before = _model(0), _model(0)
    extra = [("model.layers.3.eh_proj.weight", torch.zeros(2, 2)), (BIAS, torch.ones(SMALL.n_routed_experts))]
    with pytest.raises(WeightLoadError, match=r"model\.layers\.3\.eh_proj\.weight has no counterpart"):
        load_weight_bucket(model, extra)
    load_weight_bucket(model, extra, strict_names=False)
    assert torch.equal(model.state_dict()[BIAS], torch.ones(SMALL.n_routed_experts))
    assert not weights_equal(before, model)


def test_expert_index_out_of_range_is_unknown() -> None:
    name = f"{EXPERT}.{SMALL.n_routed_experts}.down_proj.weight"
    with pytest.raises(WeightLoadError, match=rf"{name} has no counterpart"):
        load_weight_bucket(_model(0), [(name, torch.zeros(SMALL.hidden_size, SMALL.moe_intermediate_size))])


def test_shape_mismatch_names_the_tensor() -> None:
    name = f"{EXPERT}.0.up_proj.weight"
    with pytest.raises(WeightLoadError, match=rf"{name} has shape \(3, 3\) but the model's is \(16, 32\)"):
        load_weight_bucket(_model(0), [(name, torch.zeros(3, 3))])


def test_bucket_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="bucket_bytes"):
        next(iter_weight_buckets(_model(0), 0))


def test_diff_of_models_with_different_names() -> None:
    a = [("x", torch.zeros(2)), ("y", torch.zeros(2))]
    b = [("x", torch.zeros(2))]
    assert not weights_equal(a, b)
    with pytest.raises(ValueError, match=r"only in a: \['y'\]"):
        max_weight_diff(a, b)
    assert max_weight_diff([("x", torch.tensor([1.0, -2.0]))], [("x", torch.tensor([1.5, 1.0]))]) == 3.0
