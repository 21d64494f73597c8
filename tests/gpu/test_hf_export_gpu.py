"""A 3-step Megatron run on the Moonlight-shaped slice, exported by `python -m rlinf.export_hf` (its
NCCL path, one GPU) and served by SGLang, over 64 sampled rows:

- the engine serves the exported folder: its sampled-token logprobs against HF fp32 on the folder
  stay within the slice engine test's bar (test_sglang_slice.py);
- the folder holds the trained actor: the actor's bf16 recompute against HF fp32 on the folder stays
  within the Megatron actor test's bar (no worse than HF's own bf16 + 10%, test_megatron_actor.py);
- the trained weights are served, not the base ones: the untrained slice is far further off.

Two bf16 paths (engine, actor) compared with each other differ by about twice one's rounding, so
each is held against the fp32 reference; their gap is reported.

The slice has no tokenizer of its own; its base folder here is the slice's files (linked) plus the
tiny model's character tokenizer, which the export carries (the engine is fed token ids).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from gpu_checks import recompute_logprobs, record
from test_megatron_actor import actor_config, synthetic_batch, vocab_of
from test_sglang_engine_gpu import gpu_engine_kwargs

from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.sglang_args import parse_outputs, request_seeds, sampling_dicts

ROOT = Path(__file__).resolve().parents[2]
EOS = 163586


def base_with_tokenizer(slice_dir: Path, out: Path) -> Path:
    from rlinf.data.synthetic import SYNTHETIC_CHARSET
    from rlinf.models.tiny_tokenizer import build_char_tokenizer

    out.mkdir()
    for f in slice_dir.iterdir():
        (out / f.name).symlink_to(f)
    build_char_tokenizer(SYNTHETIC_CHARSET).save_pretrained(out)
    return out


def test_exported_megatron_slice_serves_the_trained_weights(
    moonlight_slice, sglang_installed, megatron_installed, tmp_path
):
    from rlinf.config.loader import save_resolved_config
    from rlinf.data.batch import RolloutBatch
    from rlinf.models.hf_checkpoint import load_causal_lm
    from rlinf.utils.checkpoint import COMPLETE_MARKER
    from rlinf.workers.actor.base import with_logprobs
    from rlinf.workers.actor.megatron_actor import MegatronActor
    from rlinf.workers.rollout.sglang_engine import SGLangEngine

    base = base_with_tokenizer(moonlight_slice, tmp_path / "base")
    stage = lambda name, **kw: record(f"megatron slice -> HF export -> sglang: {name}", **kw)  # noqa: E731
    actor = MegatronActor(actor_config(base, "bf16", lr=1e-3))
    batch = synthetic_batch(vocab_of(base), seed=5)
    for step in range(3):  # big steps: the served logprobs must move away from the base model's
        actor.train(batch, step=step, logprobs=actor.compute_logprobs(batch))
    step_dir = tmp_path / "checkpoints" / "step_3"
    actor.save(str(step_dir / "actor"))
    save_resolved_config(actor.cfg, step_dir)
    (step_dir / COMPLETE_MARKER).write_text(json.dumps({"step": 3}))
    actor.offload()
    stage("trained 3 steps and saved", spec=actor.spec["spec"])

    out = tmp_path / "hf"
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    try:  # a timeout inside the suite's: the child's output reaches the report
        done = subprocess.run(
            [sys.executable, "-m", "rlinf.export_hf", str(step_dir), str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:  # the checkpoint (weights + optimizer state, ~35 GB) is not needed past the export
        shutil.rmtree(tmp_path / "checkpoints", ignore_errors=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    stage("exported", files=sorted(p.name for p in out.iterdir()))

    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 40, (32,), generator=generator).tolist()
    prompts = [torch.randint(0, 160000, (n,), generator=generator).tolist() for n in lengths]
    inputs = [p for p in prompts for _ in range(2)]
    params = SamplingParams(temperature=1.0, max_new_tokens=24)
    engine = SGLangEngine(gpu_engine_kwargs(str(out), mem=0.3, graphs=0), where="test engine (HF export)")
    try:
        outs = engine.generate(inputs, sampling_dicts(params, [EOS], request_seeds(11, len(inputs))))
    finally:
        engine.shutdown()
    parsed = parse_outputs(outs, inputs, pad_token_id=0)
    rows = len(inputs)
    served = RolloutBatch(
        prompt_ids=parsed.prompt_ids, prompt_mask=parsed.prompt_mask,
        response_ids=parsed.response_ids, response_mask=parsed.response_mask,
        group_index=torch.arange(rows) // 2, rollout_logprobs=parsed.logprobs,
        finish_reasons=parsed.finish_reasons, response_text=[""] * rows, solutions=[("0",)] * rows,
        advantages=torch.zeros(rows),
    )  # fmt: skip
    actor.onload()
    trained = with_logprobs(served, [actor.compute_logprobs(served)]).old_logprobs
    mask = parsed.response_mask
    figures = {"engine_vs_actor_mean": float((trained - parsed.logprobs).abs()[mask].mean())}
    del actor
    gc.collect()  # the actor's model and optimizer hold each other (megatron's config hooks)
    torch.cuda.empty_cache()
    hf = {}
    for precision in ("bf16", "fp32"):
        model = load_causal_lm(str(out), precision=precision, device=torch.device("cuda"))
        hf[precision] = recompute_logprobs(model, parsed).cpu()
        del model
        torch.cuda.empty_cache()
    untrained = recompute_logprobs(
        load_causal_lm(str(moonlight_slice), precision="fp32", device=torch.device("cuda")), parsed
    ).cpu()
    gap = lambda a, b: float((a - b).abs()[mask].mean())  # noqa: E731
    noise = gap(hf["bf16"], hf["fp32"])
    figures |= {
        "hf_bf16_vs_hf_fp32_mean": noise,
        "engine_vs_hf_fp32_mean": gap(parsed.logprobs, hf["fp32"]),
        "actor_vs_hf_fp32_mean": gap(trained, hf["fp32"]),
        "untrained_vs_hf_fp32_mean": gap(untrained, hf["fp32"]),
    }
    stage("result", tokens=int(mask.sum()), **figures)
    # The slice engine test's bar: 2e-2, or HF's own bf16 noise + 10% where that is larger.
    assert figures["engine_vs_hf_fp32_mean"] <= max(2e-2, 1.1 * noise), figures
    # The Megatron actor test's bf16 bar (test_megatron_actor.compare_logprobs).
    assert figures["actor_vs_hf_fp32_mean"] <= 1.1 * noise, figures
    assert figures["untrained_vs_hf_fp32_mean"] > 2 * figures["engine_vs_hf_fp32_mean"], figures
