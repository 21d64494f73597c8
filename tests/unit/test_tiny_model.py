"""The tiny model: tokenizer and chat template, checkpoint layout, cache, and the bootstrap's accuracy."""

from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DeepseekV3ForCausalLM

from rlinf.data.synthetic import SYNTHETIC_CHARSET, generate_arithmetic
from rlinf.models import load_causal_lm, load_tokenizer, tiny
from rlinf.models.bootstrap import encode_example, greedy_accuracy
from rlinf.models.tiny import (
    BUILD_REPORT,
    GPU_TINY_SETTINGS,
    SMALL_SETTINGS,
    TINY_URI,
    TinyModelSettings,
    build_tiny_checkpoint,
    ensure_tiny_checkpoint,
    main,
    resolve_model_path,
)
from rlinf.models.tiny_tokenizer import SPECIAL_TOKENS, build_char_tokenizer
from rlinf.rewards.math_grader import extract_last_boxed

torch.set_num_threads(1)  # tiny models: a second thread only adds OpenMP waits on a busy machine

# Stated range of the bootstrapped model's greedy validation accuracy (docs/models.md).
ACCURACY_RANGE = (0.15, 0.60)
# A build small enough for a few seconds: for layout and cache tests, not for accuracy.
QUICK = dataclasses.replace(
    SMALL_SETTINGS,
    num_hidden_layers=2,
    num_train_problems=64,
    num_val_problems=4,
    train_steps=2,
    batch_size=4,
    warmup_steps=1,
)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One tiny-model cache for the whole test session (an RLINF_CACHE_DIR set outside is kept)."""
    if "RLINF_CACHE_DIR" not in os.environ:
        os.environ["RLINF_CACHE_DIR"] = str(tmp_path_factory.mktemp("rlinf-cache"))
    return Path(os.environ["RLINF_CACHE_DIR"])


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer(SYNTHETIC_CHARSET)


def test_one_token_per_character(tokenizer) -> None:
    ids = tokenizer(SYNTHETIC_CHARSET, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(SYNTHETIC_CHARSET) and len(set(ids)) == len(ids)
    assert tokenizer.decode(ids) == SYNTHETIC_CHARSET
    assert len(tokenizer) == len(SPECIAL_TOKENS) + len(SYNTHETIC_CHARSET)


def test_special_tokens_are_single_ids_and_unknowns_are_kept(tokenizer) -> None:
    for token in SPECIAL_TOKENS:
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [
            tokenizer.convert_tokens_to_ids(token)
        ]
    assert tokenizer("1%2", add_special_tokens=False)["input_ids"][1] == tokenizer.unk_token_id
    assert tokenizer.padding_side == "left"


def test_chat_template_prompt_and_response(tokenizer) -> None:
    user = {"role": "user", "content": "What is 1 + 2?"}
    prompt = tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|bos|><|user|>What is 1 + 2?<|assistant|>"
    answer = "1 + 2 = 3. The answer is \\boxed{3}."
    full = tokenizer.apply_chat_template([user, {"role": "assistant", "content": answer}], tokenize=False)
    assert full == prompt + answer + tokenizer.eos_token
    with pytest.raises(Exception, match="only user and assistant"):
        tokenizer.apply_chat_template([{"role": "system", "content": "x"}], tokenize=False)


def test_training_example_is_the_rendered_prompt_then_the_solution(tokenizer) -> None:
    problem = generate_arithmetic("train", 1, digits=2, operations=("+", "-"), steps=2, seed=0)[0]
    prompt_ids, response_ids = encode_example(tokenizer, problem)
    assert tokenizer.decode(prompt_ids) == f"<|bos|><|user|>{problem.record.prompt}<|assistant|>"
    assert response_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(response_ids[:-1]) == problem.worked_solution


def test_checkpoint_loads_with_plain_transformers(tmp_path: Path) -> None:
    out = build_tiny_checkpoint(tmp_path / "tiny", QUICK, bootstrap=False)
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(model) is DeepseekV3ForCausalLM
    config = model.config
    assert config.q_lora_rank is None and config.kv_lora_rank == QUICK.kv_lora_rank
    assert (config.first_k_dense_replace, config.n_group, config.topk_group) == (1, 1, 1)
    assert (config.n_routed_experts, config.num_experts_per_tok, config.n_shared_experts) == (8, 2, 2)
    assert config.norm_topk_prob and not config.tie_word_embeddings and config.num_nextn_predict_layers == 0
    assert (config.scoring_func, config.topk_method) == ("sigmoid", "noaux_tc")
    assert config.vocab_size == len(tokenizer)
    assert (
        model.generation_config.eos_token_id
        == tokenizer.eos_token_id
        == tokenizer.convert_tokens_to_ids("<|im_end|>")
    )
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    report = json.loads((out / BUILD_REPORT).read_text())
    assert report["parameters"] == sum(p.numel() for p in model.parameters()) and not report["bootstrapped"]


def test_build_is_deterministic(tmp_path: Path) -> None:
    first = load_causal_lm(str(build_tiny_checkpoint(tmp_path / "a", QUICK)))
    second = load_causal_lm(str(build_tiny_checkpoint(tmp_path / "b", QUICK)))
    other_seed = load_causal_lm(
        str(build_tiny_checkpoint(tmp_path / "c", dataclasses.replace(QUICK, seed=1)))
    )
    first_state, second_state = first.state_dict(), second.state_dict()
    assert all(torch.equal(first_state[name], second_state[name]) for name in first_state)
    assert not torch.equal(first_state["lm_head.weight"], other_seed.state_dict()["lm_head.weight"])


def _attention_output_rms(checkpoint: Path) -> list[float]:
    """Each layer's attention output RMS on one fixed random batch."""
    model = load_causal_lm(str(checkpoint))
    sizes: list[float] = []
    hooks = [
        layer.self_attn.register_forward_hook(
            lambda m, i, out: sizes.append(out[0].pow(2).mean().sqrt().item())
        )
        for layer in model.model.layers
    ]
    with torch.no_grad():
        model(
            input_ids=torch.randint(
                5, model.config.vocab_size, (4, 40), generator=torch.Generator().manual_seed(0)
            )
        )
    for hook in hooks:
        hook.remove()
    return sizes


def test_wide_mla_starts_at_the_default_attention_scale(tmp_path: Path) -> None:
    """GPU-tiny's latent (256) and value heads (64) are wider than the default's (32, 32); at the
    plain 0.02 init its attention outputs are 3-7x the default model's, and it learns about half as
    fast (docs/models.md). Its build scales kv_b_proj / o_proj back to the default's output size."""
    unbuilt = {"bootstrap": False}
    default = _attention_output_rms(
        build_tiny_checkpoint(tmp_path / "default", TinyModelSettings(), **unbuilt)
    )
    gpu = _attention_output_rms(build_tiny_checkpoint(tmp_path / "gpu", GPU_TINY_SETTINGS, **unbuilt))
    plain = dataclasses.replace(GPU_TINY_SETTINGS, fan_in_scaled_attention_init=False)
    unscaled = _attention_output_rms(build_tiny_checkpoint(tmp_path / "plain", plain, **unbuilt))
    for layer, (d, g, u) in enumerate(zip(default, gpu, unscaled, strict=True)):
        assert 0.5 < g / d < 2.0, (layer, d, g)
        assert u / d > 3.0, (layer, d, u)
    assert GPU_TINY_SETTINGS.digest() != plain.digest()


def test_cache_builds_once_per_settings(tmp_path: Path) -> None:
    path = ensure_tiny_checkpoint(QUICK, cache_dir=tmp_path)
    assert path == tmp_path / "tiny" / QUICK.digest()
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_checkpoint(QUICK, cache_dir=tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert ensure_tiny_checkpoint(dataclasses.replace(QUICK, lr=QUICK.lr * 2), cache_dir=tmp_path) != path
    assert not [entry.name for entry in (tmp_path / "tiny").iterdir() if entry.name.endswith(".tmp")]


def test_concurrent_callers_share_one_build(tmp_path: Path, monkeypatch) -> None:
    builds: list[Path] = []

    def counting_build(out_dir: Path, settings: TinyModelSettings) -> Path:
        builds.append(out_dir)
        return build_tiny_checkpoint(out_dir, settings)

    monkeypatch.setattr(tiny, "build_tiny_checkpoint", counting_build)
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: ensure_tiny_checkpoint(QUICK, cache_dir=tmp_path), range(3)))
    assert len(builds) == 1 and len(set(paths)) == 1


def test_resolve_model_path_passes_other_paths_through() -> None:
    assert resolve_model_path("/models/Moonlight-16B-A3B-Instruct") == "/models/Moonlight-16B-A3B-Instruct"
    with pytest.raises(ValueError, match="unknown tiny model 'tiny://other'"):
        resolve_model_path("tiny://other")


def test_cli_writes_a_checkpoint(tmp_path: Path, capsys) -> None:
    main(["--out", str(tmp_path / "cli"), "--no-bootstrap", "--seed", "3"])
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["seed"] == 3 and (tmp_path / "cli" / "config.json").is_file()


@pytest.mark.slow
def test_bootstrapped_model_is_partly_right_and_always_boxes(cache_dir: Path) -> None:
    path = Path(resolve_model_path(TINY_URI))
    assert path.parent == cache_dir / "tiny"
    settings = TinyModelSettings()
    model, tokenizer = load_causal_lm(str(path)), load_tokenizer(str(path))
    val = generate_arithmetic(
        "val",
        settings.num_val_problems,
        digits=settings.digits,
        operations=settings.operations,
        steps=settings.steps,
        seed=settings.seed,
    )
    evaluation = greedy_accuracy(model, tokenizer, val, max_new_tokens=80)
    assert ACCURACY_RANGE[0] <= evaluation.accuracy <= ACCURACY_RANGE[1]
    assert all(extract_last_boxed(response) is not None for response in evaluation.responses)
    report = json.loads((path / BUILD_REPORT).read_text())
    assert report["val_greedy_accuracy"] == evaluation.accuracy  # what the build measured


def test_a_build_in_a_child_process_equals_the_build_in_this_one(tmp_path: Path) -> None:
    here = build_tiny_checkpoint(tmp_path / "here", QUICK)
    child = tiny.build_in_child(tmp_path / "child", QUICK, "cpu")  # the GPU path's process, on the CPU
    a, b = (AutoModelForCausalLM.from_pretrained(str(p)).state_dict() for p in (here, child))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    report = json.loads((child / BUILD_REPORT).read_text())
    assert (
        report["warm_start_device"] == "cpu"
        and tiny.settings_from_json(json.dumps(report["settings"])) == QUICK
    )


def test_the_cache_builds_in_a_child_process_where_a_gpu_is_seen(tmp_path: Path, monkeypatch) -> None:
    children: list[tuple[Path, TinyModelSettings, str]] = []

    def child(out_dir: Path, settings: TinyModelSettings, device: str) -> Path:
        children.append((out_dir, settings, device))
        return build_tiny_checkpoint(out_dir, settings)

    monkeypatch.setattr(tiny, "warm_start_device", lambda: "cuda")
    monkeypatch.setattr(tiny, "build_in_child", child)
    path = ensure_tiny_checkpoint(QUICK, cache_dir=tmp_path)
    assert [(s, d) for _, s, d in children] == [(QUICK, "cuda")] and (path / BUILD_REPORT).is_file()


def test_settings_travel_to_the_child_as_json_unchanged() -> None:
    text = json.dumps(dataclasses.asdict(GPU_TINY_SETTINGS))
    assert tiny.settings_from_json(text) == GPU_TINY_SETTINGS
    assert tiny.settings_from_json(text).digest() == GPU_TINY_SETTINGS.digest()


def test_a_warm_start_with_a_target_stops_at_the_first_check_that_reaches_it(tmp_path, monkeypatch) -> None:
    """GPU-tiny's warm start ends at a greedy accuracy, not at a step count: the same steps reach
    more on a GPU than on a CPU (near-ties decided by rounding), the target does not move."""
    from rlinf.models import bootstrap

    seen = iter([0.1, 0.3, 0.45, 0.9])
    real = bootstrap.greedy_accuracy

    def staged(model, tokenizer, problems, **kw):
        measured = real(model, tokenizer, problems, **kw)
        return dataclasses.replace(measured, accuracy=next(seen, measured.accuracy))

    monkeypatch.setattr(bootstrap, "greedy_accuracy", staged)
    settings = dataclasses.replace(QUICK, train_steps=12, target_accuracy=0.4, check_every=2)
    report = json.loads((build_tiny_checkpoint(tmp_path / "t", settings) / BUILD_REPORT).read_text())
    assert report["warm_start_checks"] == [[2, 0.1], [4, 0.3], [6, 0.45]]
    assert report["warm_start_steps"] == 6
    assert report["val_greedy_accuracy"] == 0.45  # the stopping check is the final measurement
    assert next(seen) == 0.9  # not measured again
    without = json.loads((build_tiny_checkpoint(tmp_path / "u", QUICK) / BUILD_REPORT).read_text())
    assert without["warm_start_steps"] == QUICK.train_steps and "warm_start_checks" not in without
