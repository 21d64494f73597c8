"""The Megatron actor on one GPU (TP = EP = 1) against the HF model and against itself.

- logprobs equal the HF model's (rlinf.models.logprobs) on the GPU-tiny checkpoint and on the
  Moonlight-shaped slice: fp32 max |diff| <= 1e-3, bf16 mean |diff| <= 2e-2;
- exported HF weights equal the checkpoint's tensors bit for bit before training;
- one GRPO minibatch gives the same loss and grad norm as the torch actor (fp32);
- offload frees the weights / grads / optimizer memory and onload restores identical logprobs;
- save -> train -> load -> train repeats the same step exactly (weights, optimizer state, RNG).

Figures go to $RLINF_GPU_FIGURES (JSON lines) when set. Run: bash tests/gpu/run_megatron_checks.sh
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlinf.config.schema import ActorConfig, AlgorithmConfig, Config, ModelConfig, OptimConfig, RunnerConfig
from rlinf.data.batch import RolloutBatch


def record(name: str, **figures) -> None:
    line = json.dumps({"check": name, **figures})
    print(line)
    path = os.environ.get("RLINF_GPU_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def actor_config(path: Path, precision: str, *, lr: float = 1e-5, mbs: int = 4, gbs: int = 8) -> Config:
    return Config(
        runner=RunnerConfig(seed=7),
        algorithm=AlgorithmConfig(),
        actor=ActorConfig(
            training_backend="megatron",
            micro_batch_size=mbs,
            global_batch_size=gbs,
            seq_length=256,
            model=ModelConfig(model_path=str(path), precision=precision),
            optim=OptimConfig(lr=lr, weight_decay=0.0),
        ),
    )


def synthetic_batch(
    vocab: int, rows: int = 8, prompt: int = 12, response: int = 10, seed: int = 0
) -> RolloutBatch:
    """Left-padded prompts and right-padded responses of varied lengths, GRPO-ready fields."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab, (rows, prompt), generator=g)
    response_ids = torch.randint(3, vocab, (rows, response), generator=g)
    p_len = torch.randint(3, prompt + 1, (rows,), generator=g)
    r_len = torch.randint(1, response + 1, (rows,), generator=g)
    prompt_mask = torch.arange(prompt)[None] >= (prompt - p_len)[:, None]
    response_mask = torch.arange(response)[None] < r_len[:, None]
    prompt_ids = prompt_ids.masked_fill(~prompt_mask, 0)
    response_ids = response_ids.masked_fill(~response_mask, 0)
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        group_index=torch.arange(rows) // 4,
        rollout_logprobs=torch.zeros(rows, response),
        finish_reasons=["stop"] * rows,
        response_text=[""] * rows,
        solutions=[("0",)] * rows,
        advantages=torch.randn(rows, generator=g),
    )


def hf_logprobs(path: Path, precision: str, batch: RolloutBatch) -> torch.Tensor:
    from rlinf.models.loader import load_causal_lm
    from rlinf.models.logprobs import response_logprobs

    model = load_causal_lm(str(path), precision=precision, device=torch.device("cuda"))
    with torch.no_grad():
        lp, _ = response_logprobs(
            model,
            batch.prompt_ids.cuda(),
            batch.prompt_mask.cuda(),
            batch.response_ids.cuda(),
            batch.response_mask.cuda(),
        )
    del model
    return lp.float().cpu()


def free(*objs) -> None:
    del objs
    gc.collect()
    torch.cuda.empty_cache()


def vocab_of(path: Path) -> int:
    return json.loads((path / "config.json").read_text())["vocab_size"]


def _compare_logprobs(path: Path, precision: str, name: str) -> None:
    from rlinf.workers.actor.megatron_actor import MegatronActor

    batch = synthetic_batch(vocab_of(path))
    reference = hf_logprobs(path, precision, batch)
    actor = MegatronActor(actor_config(path, precision))
    got = actor.compute_logprobs(batch).old_logprobs
    free(actor)
    mask = batch.response_mask
    diff = (got - reference)[mask].abs()
    record(
        name,
        precision=precision,
        max_abs_diff=diff.max().item(),
        mean_abs_diff=diff.mean().item(),
        tokens=int(mask.sum()),
    )
    assert torch.isfinite(got[mask]).all()
    if precision == "fp32":
        assert diff.max().item() <= 1e-3
    else:
        assert diff.mean().item() <= 2e-2


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_logprobs_match_hf_on_gpu_tiny(megatron_installed, gpu_tiny, precision):
    _compare_logprobs(gpu_tiny, precision, "megatron vs HF logprobs, GPU-tiny")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_logprobs_match_hf_on_moonlight_slice(megatron_installed, moonlight_slice, precision):
    _compare_logprobs(moonlight_slice, precision, "megatron vs HF logprobs, Moonlight slice (4 layers)")


def _checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


@pytest.mark.parametrize("which", ["gpu_tiny", "moonlight_slice"])
def test_exported_weights_equal_the_checkpoint_bit_for_bit(megatron_installed, request, which):
    from rlinf.workers.actor.megatron_actor import MegatronActor

    path = request.getfixturevalue(which)
    stored = _checkpoint_tensors(path)
    precision = {torch.float32: "fp32", torch.bfloat16: "bf16"}[next(iter(stored.values())).dtype]
    actor = MegatronActor(actor_config(path, precision))
    exported = actor.named_weights()
    free(actor)
    missing = sorted(set(stored) - set(exported))
    extra = sorted(set(exported) - set(stored))
    unequal = sorted(
        n for n in set(stored) & set(exported) if not torch.equal(stored[n], exported[n].to(stored[n].dtype))
    )
    dtype_changed = sorted(n for n in set(stored) & set(exported) if stored[n].dtype != exported[n].dtype)
    record(
        f"export equals checkpoint ({which})",
        tensors=len(exported),
        missing=missing[:5],
        extra=extra[:5],
        unequal=unequal[:5],
    )
    assert not missing and not extra and not unequal and not dtype_changed


def test_one_minibatch_matches_the_torch_actor(megatron_installed, gpu_tiny):
    """Same batch, fp32, lr 0 (weights unchanged): loss, ratio and grad norm of both backends agree."""
    from rlinf.workers.actor.megatron_actor import MegatronActor
    from rlinf.workers.actor.torch_actor import TorchActor

    cfg = actor_config(gpu_tiny, "fp32", lr=0.0, mbs=3, gbs=8)  # 3 micro-batches: 3 + 3 + 2 rows
    batch = synthetic_batch(vocab_of(gpu_tiny), seed=3)
    torch_cfg = replace(cfg, actor=replace(cfg.actor, training_backend="torch"))
    reference = TorchActor(torch_cfg)
    ref_batch = reference.compute_logprobs(batch)
    ref = reference.train(replace(ref_batch, old_logprobs=ref_batch.old_logprobs - 0.05), step=0)
    free(reference)
    actor = MegatronActor(cfg)
    mine = actor.compute_logprobs(batch)
    got = actor.train(replace(mine, old_logprobs=mine.old_logprobs - 0.05), step=0)
    free(actor)
    keys = ("actor/loss", "actor/ratio_mean", "actor/grad_norm", "actor/approx_kl")
    record("one minibatch: megatron vs torch actor (fp32)", **{k: [ref[k], got[k]] for k in keys})
    for k in keys:
        assert got[k] == pytest.approx(ref[k], rel=2e-3, abs=1e-5), k


def test_offload_frees_memory_and_onload_restores_the_model(megatron_installed, moonlight_slice):
    from rlinf.workers.actor.megatron_actor import MegatronActor

    actor = MegatronActor(actor_config(moonlight_slice, "bf16", lr=1e-6))
    num_params = sum(p.numel() for chunk in actor.model for p in chunk.parameters())
    batch = synthetic_batch(vocab_of(moonlight_slice), seed=4)
    trained = actor.compute_logprobs(batch)
    actor.train(trained, step=0)  # allocates the optimizer state
    before = actor.compute_logprobs(batch).old_logprobs
    allocated = torch.cuda.memory_allocated()
    freed = actor.offload()["actor/offload_freed_gib"]
    after_offload = torch.cuda.memory_allocated()
    actor.onload()
    again = actor.compute_logprobs(batch).old_logprobs
    free(actor)
    # bf16 weights (2 B) + fp32 grads (4 B) + fp32 master, exp_avg, exp_avg_sq (12 B) per parameter
    expected = num_params * 18 / 2**30
    record(
        "offload / onload (Moonlight slice, bf16 weights, fp32 grads and optimizer)",
        params=num_params,
        allocated_gib=allocated / 2**30,
        expected_gib=expected,
        freed_gib=freed,
        left_gib=after_offload / 2**30,
    )
    assert torch.equal(before, again)
    assert freed >= 0.95 * expected


def test_save_load_resumes_exactly(megatron_installed, gpu_tiny, tmp_path):
    from rlinf.workers.actor.megatron_actor import MegatronActor

    actor = MegatronActor(actor_config(gpu_tiny, "fp32", lr=1e-4))
    batch = synthetic_batch(vocab_of(gpu_tiny), seed=5)
    actor.train(actor.compute_logprobs(batch), step=0)
    actor.save(str(tmp_path / "ckpt"))
    first = actor.train(actor.compute_logprobs(batch), step=1)
    weights_first = actor.named_weights()
    actor.load(str(tmp_path / "ckpt"))
    second = actor.train(actor.compute_logprobs(batch), step=1)
    weights_second = actor.named_weights()
    free(actor)
    worst = max((weights_first[n] - weights_second[n]).abs().max().item() for n in weights_first)
    record(
        "save / load / same step (GPU-tiny fp32)",
        loss=[first["actor/loss"], second["actor/loss"]],
        max_weight_diff=worst,
    )
    assert second == pytest.approx(first, rel=1e-6, abs=1e-9)
    assert worst <= 1e-7  # bit-exact unless an attention backward kernel accumulates in another order
