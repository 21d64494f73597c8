"""Loading DeepSeek-V3-family checkpoints: native model, MTP extras skipped, clear errors."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

from rlinf.models import ModelLoadError, load_causal_lm, load_model_config, load_tokenizer
from rlinf.models.tiny import SMALL_SETTINGS as SMALL
from rlinf.models.tiny import build_tiny_checkpoint

torch.set_num_threads(1)  # tiny models: a second thread only adds OpenMP waits on a busy machine

MOONLIGHT_CONFIG = Path(__file__).parents[1] / "fixtures" / "moonlight-16b-a3b-config.json"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A random (not bootstrapped) small DeepSeek-V3 checkpoint with a non-zero routing bias."""
    out = tmp_path_factory.mktemp("tiny")
    build_tiny_checkpoint(out, SMALL, bootstrap=False)
    weights = load_file(out / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for name, tensor in weights.items():
        if name.endswith("e_score_correction_bias"):
            weights[name] = torch.randn(tensor.shape, generator=generator) * 0.1
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _input_ids(vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (3, 17), generator=torch.Generator().manual_seed(1))


def _copy_with_config(source: Path, target: Path, **overrides: object) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | overrides))
    return target


def test_moonlight_fixture_config_fields(tmp_path: Path) -> None:
    shutil.copy(MOONLIGHT_CONFIG, tmp_path / "config.json")
    config = load_model_config(str(tmp_path))
    assert isinstance(config, DeepseekV3Config)
    assert config.model_type == "deepseek_v3"
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (2048, 27, 163840)
    assert config.q_lora_rank is None and config.kv_lora_rank == 512
    assert (config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim) == (128, 64, 128)
    assert (config.n_routed_experts, config.num_experts_per_tok, config.n_shared_experts) == (64, 6, 2)
    assert (config.first_k_dense_replace, config.n_group, config.topk_group) == (1, 1, 1)
    assert config.routed_scaling_factor == pytest.approx(2.446)
    assert config.norm_topk_prob is True and config.tie_word_embeddings is False
    assert config.num_nextn_predict_layers == 0
    assert not hasattr(config, "auto_map")  # remote modelling code is never used


def test_scaled_down_moonlight_builds_and_runs(tmp_path: Path) -> None:
    # Moonlight's widths, but 2 layers, 4 experts and a small vocabulary so it builds in seconds.
    raw = json.loads(MOONLIGHT_CONFIG.read_text())
    raw |= {"num_hidden_layers": 2, "n_routed_experts": 4, "num_experts_per_tok": 2, "vocab_size": 512}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(load_model_config(str(tmp_path))).eval()

    dense, moe = model.model.layers
    assert dense.mlp.gate_proj.out_features == 11264
    assert moe.mlp.experts.gate_up_proj.shape == (4, 2 * 1408, 2048)
    assert moe.mlp.shared_experts.gate_proj.out_features == 2 * 1408
    assert moe.mlp.gate.e_score_correction_bias.shape == (4,)
    attention = moe.self_attn
    assert attention.q_proj.out_features == 16 * (128 + 64) and attention.q_a_proj is None
    assert attention.kv_a_proj_with_mqa.out_features == 512 + 64
    assert attention.kv_b_proj.out_features == 16 * (128 + 128)
    with torch.no_grad():
        logits = model(_input_ids(512)[:, :5]).logits
    assert logits.shape == (3, 5, 512) and torch.isfinite(logits).all()


@pytest.mark.parametrize("precision, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_logits_match_transformers_reference(checkpoint: Path, precision: str, dtype: torch.dtype) -> None:
    ours = load_causal_lm(str(checkpoint), precision=precision)
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()
    assert type(ours) is DeepseekV3ForCausalLM and ours.dtype == dtype and not ours.training
    assert ours.config._attn_implementation == "sdpa"
    input_ids = _input_ids(ours.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(ours(input_ids).logits, reference(input_ids).logits)


def test_routing_bias_loaded_and_kept_in_fp32(checkpoint: Path) -> None:
    model = load_causal_lm(str(checkpoint), precision="bf16")
    stored = load_file(checkpoint / "model.safetensors")["model.layers.1.mlp.gate.e_score_correction_bias"]
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    assert bias.dtype == torch.float32 and torch.equal(bias, stored) and bias.abs().sum() > 0


def test_mtp_layers_in_checkpoint_are_skipped(checkpoint: Path, tmp_path: Path, capfd) -> None:
    with_mtp = _copy_with_config(checkpoint, tmp_path / "mtp", num_nextn_predict_layers=1)
    weights = load_file(with_mtp / "model.safetensors")
    last = SMALL.num_hidden_layers - 1
    mtp = SMALL.num_hidden_layers  # stored as one more layer after the last decoder layer
    # An MTP module: a full (MoE) decoder layer plus its own norms, projection and head.
    extras = {
        name.replace(f"model.layers.{last}.", f"model.layers.{mtp}."): tensor + 1
        for name, tensor in weights.items()
        if name.startswith(f"model.layers.{last}.")
    }
    hidden, vocab = SMALL.hidden_size, weights["lm_head.weight"].shape[0]
    extras |= {
        f"model.layers.{mtp}.enorm.weight": torch.ones(hidden),
        f"model.layers.{mtp}.hnorm.weight": torch.ones(hidden),
        f"model.layers.{mtp}.eh_proj.weight": torch.randn(hidden, 2 * hidden),
        f"model.layers.{mtp}.embed_tokens.weight": torch.randn(vocab, hidden),
        f"model.layers.{mtp}.shared_head.norm.weight": torch.ones(hidden),
        f"model.layers.{mtp}.shared_head.head.weight": torch.randn(vocab, hidden),
    }
    assert any(".experts.0.gate_proj.weight" in name for name in extras)
    save_file(weights | extras, with_mtp / "model.safetensors", metadata={"format": "pt"})
    capfd.readouterr()

    model = load_causal_lm(str(with_mtp))

    assert "UNEXPECTED" not in capfd.readouterr().err
    assert len(model.model.layers) == SMALL.num_hidden_layers
    plain = load_causal_lm(str(checkpoint))
    input_ids = _input_ids(vocab)
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits, plain(input_ids).logits)


def test_tokenizer_loads(checkpoint: Path) -> None:
    tokenizer = load_tokenizer(str(checkpoint))
    assert tokenizer.decode(tokenizer("12 + 7", add_special_tokens=False)["input_ids"]) == "12 + 7"


def test_missing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelLoadError, match=f"{missing} does not exist"):
        load_causal_lm(str(missing))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tokenizer(str(missing))


def test_tiny_uri_needs_resolving_first() -> None:
    with pytest.raises(ModelLoadError, match="resolve_model_path"):
        load_model_config("tiny://bootstrap")


def test_missing_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=rf"{tmp_path / 'config.json'} is missing"):
        load_model_config(str(tmp_path))


def test_malformed_config_names_file_and_position(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{\n  "model_type": "deepseek_v3",\n  "hidden_size": ,\n}')
    with pytest.raises(ModelLoadError) as error:
        load_model_config(str(tmp_path))
    message = str(error.value)
    assert str(tmp_path / "config.json") in message and "line 3 column 18" in message


def test_config_must_be_an_object(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="JSON object"):
        load_model_config(str(tmp_path))


def test_unsupported_model_type(checkpoint: Path, tmp_path: Path) -> None:
    directory = _copy_with_config(checkpoint, tmp_path / "llama", model_type="llama")
    with pytest.raises(ModelLoadError) as error:
        load_causal_lm(str(directory))
    message = str(error.value)
    assert str(directory / "config.json") in message
    assert "'model_type' is 'llama'" in message and "deepseek_v3" in message


def test_missing_required_field(checkpoint: Path, tmp_path: Path) -> None:
    directory = _copy_with_config(checkpoint, tmp_path / "no_kv_lora")
    config = json.loads((directory / "config.json").read_text())
    del config["kv_lora_rank"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"missing required field\(s\) kv_lora_rank"):
        load_model_config(str(directory))


def test_unsupported_routing(checkpoint: Path, tmp_path: Path) -> None:
    directory = _copy_with_config(checkpoint, tmp_path / "softmax", scoring_func="softmax")
    with pytest.raises(ModelLoadError, match="'scoring_func' is 'softmax'"):
        load_model_config(str(directory))


def test_invalid_field_value(checkpoint: Path, tmp_path: Path) -> None:
    directory = _copy_with_config(checkpoint, tmp_path / "bad_type", hidden_size="wide")
    with pytest.raises(ModelLoadError, match="hidden_size"):
        load_model_config(str(directory))


def test_no_weight_files(checkpoint: Path, tmp_path: Path) -> None:
    directory = _copy_with_config(checkpoint, tmp_path / "no_weights")
    (directory / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weight files"):
        load_causal_lm(str(directory))


def test_weights_that_do_not_match_the_config(checkpoint: Path, tmp_path: Path) -> None:
    # A config with a query LoRA expects q_a_proj/q_b_proj, which the checkpoint does not have.
    directory = _copy_with_config(checkpoint, tmp_path / "q_lora", q_lora_rank=16)
    with pytest.raises(ModelLoadError, match=r"missing_keys: .*q_a_proj"):
        load_causal_lm(str(directory))


def test_unknown_precision(checkpoint: Path) -> None:
    with pytest.raises(ModelLoadError, match="precision must be one of fp32, bf16, fp16"):
        load_causal_lm(str(checkpoint), precision="fp8")


def test_settings_are_hashable_names() -> None:
    # The cache key changes with any setting, so a changed build is never served from the cache.
    assert SMALL.digest() != dataclasses.replace(SMALL, seed=1).digest()
    assert SMALL.digest() == dataclasses.replace(SMALL).digest()
