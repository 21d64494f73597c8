"""SGLang serving the GPU-tiny checkpoint: sampled-token logprobs equal the actor's recompute, a
weight push (CUDA IPC from this process's HF model, and CPU buckets) makes the engine serve exactly
those weights, and memory released / resumed around training is measured.

Figures go to stdout and, when RLINF_GPU_FIGURES names a file, to it as JSON lines.
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace

import pytest
import torch
from gpu_checks import (
    GREEDY_REGRET_BF16,
    bf16_regret_bar,
    engine_greedy,
    greedy_regret,
    hf_greedy,
    recompute_logprobs,
    record,
)

from rlinf.config.schema import Config
from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.sglang_args import engine_kwargs, parse_outputs, request_seeds, sampling_dicts

GIB = 1024**3
PROMPTS = ["1+2-3=", "4-1+2=", "9-8+7=", "5+5-1="]


def gpu_engine_kwargs(
    path: str, *, colocated: bool = True, needs_tokenizer: bool = False, mem: float = 0.25, graphs: int = 8
):
    """Engine args as the rollout builds them; triton attention (no FA3 kernels carried); `graphs`
    = largest CUDA-graph batch (0: none, a faster start for the checks that do not need them)."""
    cfg = Config()
    sglang = replace(cfg.rollout.sglang, attention_backend="triton", cuda_graph_max_bs=graphs)
    cfg = replace(cfg, rollout=replace(cfg.rollout, sglang=sglang, gpu_memory_utilization=mem))
    return engine_kwargs(cfg, model_path=path, colocated=colocated, needs_tokenizer=needs_tokenizer)


def free_gib() -> float:
    return torch.cuda.mem_get_info()[0] / GIB


@pytest.fixture(scope="module")
def tiny(gpu_tiny, sglang_installed):
    from rlinf.models.hf_checkpoint import load_causal_lm, load_tokenizer
    from rlinf.workers.rollout.sglang_engine import SGLangEngine

    free_before = free_gib()
    # With the engine's tokenizer, so min_new_tokens works too (the slice's engine runs without one).
    engine = SGLangEngine(gpu_engine_kwargs(str(gpu_tiny), needs_tokenizer=True), where="test engine (tiny)")
    tokenizer = load_tokenizer(str(gpu_tiny))
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    yield {
        "engine": engine,
        "path": str(gpu_tiny),
        "tokenizer": tokenizer,
        "prompts": prompts,
        "eos": [tokenizer.eos_token_id],
        "pad": tokenizer.pad_token_id,
        "free_before": free_before,
        "load": lambda precision: load_causal_lm(
            str(gpu_tiny), precision=precision, device=torch.device("cuda")
        ),
    }
    engine.shutdown()


def _generate(t, params: SamplingParams, n: int = 1, seed: int = 7):
    inputs = [p for p in t["prompts"] for _ in range(n)]
    outs = t["engine"].generate(inputs, sampling_dicts(params, t["eos"], request_seeds(seed, len(inputs))))
    return parse_outputs(outs, inputs, t["pad"])


def _mismatch(model, parsed, temperature: float) -> float:
    lp = recompute_logprobs(model, parsed, temperature)
    return float((lp - parsed.logprobs.cuda()).abs()[parsed.response_mask.cuda()].mean())


def test_tiny_logprobs_equal_the_actor_recompute(tiny):
    params = SamplingParams(temperature=1.0, max_new_tokens=24)
    parsed = _generate(tiny, params, n=4)
    # n samples of one prompt, each with its own seed: not all the same
    groups = parsed.response_ids.view(len(PROMPTS), 4, -1)
    assert any(len({tuple(r.tolist()) for r in g}) > 1 for g in groups)
    bf16 = _mismatch(tiny["load"]("bf16"), parsed, 1.0)
    fp32 = _mismatch(tiny["load"]("fp32"), parsed, 1.0)
    hot = SamplingParams(temperature=0.6, max_new_tokens=24)
    parsed_hot = _generate(tiny, hot, n=2, seed=8)
    bf16_t06 = _mismatch(tiny["load"]("bf16"), parsed_hot, 0.6)
    record(
        "tiny logprobs vs actor recompute",
        mean_abs_diff_bf16=bf16,
        mean_abs_diff_fp32=fp32,
        mean_abs_diff_bf16_temperature_0_6=bf16_t06,
        tokens=int(parsed.response_mask.sum()),
    )
    assert bf16 <= 2e-2 and bf16_t06 <= 2e-2


def _hf_greedy(model, t, max_new: int):
    return hf_greedy(model, t["prompts"], t["eos"], t["pad"], max_new)


def _engine_greedy(t, max_new: int):
    return engine_greedy(t["engine"], t["prompts"], t["eos"], t["pad"], max_new)


def test_weight_updates_serve_the_actor_weights_and_memory_is_handed_over(tiny):
    """CPU buckets (object-store path) load perturbed weights; then the colocated path, released
    engine -> resumed weights -> CUDA IPC buckets -> flush -> resumed KV cache, loads the original
    weights back: every tensor the engine serves then hashes as it did when loaded from the checkpoint
    (SGLang's weight checksums). Greedy outputs must be HF's greedy choices (up to bf16 near-ties) on
    each. The CPU path goes first: the IPC exporter
    patches torch's tensor pickling for CUDA handles (sglang's monkey_patch_torch_reductions), after
    which this process can no longer serialize CPU tensors for SGLang (seen on the H200: IndexError
    in patch_torch.py). In a real run exporter and engine live in different processes."""
    from rlinf.models.weights import checkpoint_tensors, iter_weight_buckets
    from rlinf.weight_sync.exporter import WeightExporter

    engine, max_new = tiny["engine"], 12
    original = tiny["load"]("bf16")
    loaded = engine.weight_checksums()  # the checkpoint's weights, as the engine loaded them
    before = _engine_greedy(tiny, max_new)
    before_again = _engine_greedy(tiny, max_new)  # the same weights, served twice
    # The random checkpoint's greedy path has near-ties (top-2 gaps from 0.002 nats): each engine
    # token must be fp32 HF's greedy choice up to what bf16 does to this checkpoint, measured here on
    # HF's own bf16 greedy path (an independent bf16 implementation), plus the engine's kernel noise
    fp32 = tiny["load"]("fp32")
    hf_bf16 = _hf_greedy(original, tiny, max_new)
    bar, hf_bf16_regret = bf16_regret_bar(fp32, tiny["prompts"], hf_bf16)
    regret_before = greedy_regret(fp32, tiny["prompts"], before)
    model = tiny["load"]("bf16")
    with torch.no_grad():  # every weight moved
        torch.manual_seed(3)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    expected = _hf_greedy(model, tiny, max_new)
    for bucket in iter_weight_buckets(model, 4 * 1024 * 1024):
        engine.load_tensors([(n, t.detach().cpu()) for n, t in bucket])
    engine.flush_cache()
    perturbed_sums = engine.weight_checksums()
    perturbed = _engine_greedy(tiny, max_new)
    regret_perturbed = greedy_regret(copy.deepcopy(model).float(), tiny["prompts"], perturbed)

    free_up = free_gib()
    engine.release()  # sleep: KV cache, CUDA graphs, weights
    torch.cuda.synchronize()
    free_released = free_gib()
    engine.resume(["weights"])
    exporter = WeightExporter(lambda: checkpoint_tensors(original))
    exporter.begin(4 * 1024 * 1024)  # several buckets
    layouts = []
    while (layout := exporter.next_bucket()) is not None:
        layouts.append(layout)
        engine.load_tensors([exporter.ipc_handle()], flattened=True)
    engine.flush_cache()
    exporter.end()
    engine.resume()
    free_resumed = free_gib()
    restored_sums = engine.weight_checksums()
    restored = _engine_greedy(tiny, max_new)
    restored_again = _engine_greedy(tiny, max_new)
    regret_restored = greedy_regret(fp32, tiny["prompts"], restored)
    unequal = sorted(n for n in loaded if restored_sums.get(n) != loaded[n])
    record(
        "tiny weight updates (CPU buckets, then CUDA IPC after release/resume) + memory",
        buckets=len(layouts),
        free_gib_before_engine=round(tiny["free_before"], 1),
        free_gib_engine_up=round(free_up, 1),
        free_gib_released=round(free_released, 1),
        free_gib_resumed=round(free_resumed, 1),
        cpu_path_rows_equal=sum(a == b for a, b in zip(perturbed, expected, strict=True)),
        ipc_path_rows_equal=sum(a == b for a, b in zip(restored, before, strict=True)),
        tensors_checked=len(loaded),
        tensors_changed_by_perturbation=sum(perturbed_sums.get(n) != d for n, d in loaded.items()),
        tensors_unequal_after_ipc_restore=unequal[:5],
        same_weights_twice_rows_equal=sum(a == b for a, b in zip(before, before_again, strict=True)),
        restored_twice_rows_equal=sum(a == b for a, b in zip(restored, restored_again, strict=True)),
        restored_greedy_regret=regret_restored,
        rows=len(expected),
        changed_by_perturbation=sum(a != b for a, b in zip(perturbed, before, strict=True)),
        original_rows_equal_hf_greedy=sum(a == b for a, b in zip(before, hf_bf16, strict=True)),
        original_greedy_regret=regret_before,
        hf_bf16_greedy_regret=hf_bf16_regret,
        perturbed_greedy_regret=regret_perturbed,
    )
    assert regret_before <= bar, (regret_before, hf_bf16_regret)
    assert regret_perturbed <= GREEDY_REGRET_BF16 and perturbed != before, regret_perturbed
    assert free_released - free_up > 1.0  # the KV cache pool (~GiBs) went back to the GPU
    # The engine serves exactly the pushed weights, tensor for tensor. Its greedy tokens are then
    # checked as on the other two pushes, by regret against HF, not by equality with `before`: the
    # same weights served twice in a row, nothing pushed between, already differ on near-tied rows
    # (seen on the H200: 2 of 4 rows equal; the engine's bf16 path is not run-to-run deterministic),
    # so equality would test the engine's kernel path, not its weights.
    assert not unequal and set(restored_sums) == set(loaded)
    assert regret_restored <= bar, (regret_restored, hf_bf16_regret)


def _eos_logprobs(model, parsed, eos: int, steps: int) -> torch.Tensor:
    """[B, steps] log p(EOS) at each of the first `steps` response positions, after each row's
    sampled prefix (column t swapped to EOS: a causal model's logprob there reads only the prefix)."""
    columns = []
    for t in range(steps):
        ids = parsed.response_ids.clone()
        ids[:, t] = eos
        columns.append(recompute_logprobs(model, replace(parsed, response_ids=ids))[:, t])
    return torch.stack(columns, dim=1)


def test_min_new_tokens_logprobs(tiny, gpu_tiny):
    """min_new_tokens > 0 reads req.tokenizer in SGLang's penalizer, so this engine loads the
    tokenizer (engine_kwargs(needs_tokenizer=True)). Measures what SGLang reports on the EOS-masked
    steps against the actor's full-distribution recompute (the logprob convention question).
    RLINF_SGLANG_DEATH_CHECK=1 also starts an engine without tokenizer and records how it fails."""
    from rlinf.workers.rollout.sglang_engine import EngineDiedError, SGLangEngine

    params = SamplingParams(temperature=1.0, max_new_tokens=8, min_new_tokens=4)
    parsed = _generate(tiny, params, n=4)
    assert (parsed.response_mask.sum(1) >= 4).all()
    model = tiny["load"]("fp32")
    gap = parsed.logprobs.cuda() - recompute_logprobs(model, parsed)
    later = gap[:, 4:][parsed.response_mask[:, 4:].cuda()]
    # On the masked steps SGLang reports the EOS-masked distribution, whose logprobs are higher than
    # the full distribution's by -log(1 - p_eos): the known value, from the same recompute
    eos_lp = _eos_logprobs(model, parsed, tiny["eos"][0], steps=4)
    expected = -torch.log1p(-eos_lp.exp())
    off = gap[:, :4] - expected
    record(
        "min_new_tokens=4 logprobs (SGLang minus full-distribution fp32 recompute)",
        masked_steps_mean=float(gap[:, :4].mean()),
        masked_steps_min=float(gap[:, :4].min()),
        masked_steps_expected_mean=float(expected.mean()),
        masked_minus_expected_mean_abs=float(off.abs().mean()),
        masked_minus_expected_by_step=[round(float(v), 5) for v in off.mean(0)],
        masked_minus_expected_max_abs=float(off.abs().max()),
        later_steps_mean_abs=float(later.abs().mean()) if later.numel() else None,
        later_steps_max_abs=float(later.abs().max()) if later.numel() else None,
    )
    # Steps past min_new_tokens sample from the full distribution: SGLang's logprobs equal the
    # recompute (bf16 engine vs fp32 HF); the masked steps equal it plus the EOS mask's correction,
    # on the same bar. The full-distribution convention would leave the masked gap at ~0.
    assert later.numel() and float(later.abs().mean()) <= 2e-2
    assert float(off.abs().mean()) <= 2e-2
    assert float(gap[:, :4].mean()) >= 0.5 * float(expected.mean()) > 0
    if not os.environ.get("RLINF_SGLANG_DEATH_CHECK"):
        return  # one more engine start (~1 min of device time): opt-in
    tiny["engine"].shutdown()
    died = None
    engine = SGLangEngine(
        gpu_engine_kwargs(str(gpu_tiny), graphs=0), where="test engine (tiny, no tokenizer)"
    )
    try:
        _generate(dict(tiny, engine=engine), params)
    except EngineDiedError as err:
        died = str(err)
    finally:
        engine.shutdown()
    record(
        "min_new_tokens with skip_tokenizer_init", engine_died=died is not None, message=(died or "")[-600:]
    )
