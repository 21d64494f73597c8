"""The Moonlight weight-sync path without Ray: a Megatron actor and an SGLang engine colocated on
one GPU, driven in the runner's memory order (rlinf/runners/colocation.py): generate -> engine
releases everything -> train -> engine resumes its weights -> CUDA IPC buckets from Megatron-Bridge's
GPU export -> flush -> actor offloads -> engine resumes its KV cache -> generate. The engine must then
serve exactly the trained weights (greedy equal to HF's on the actor's export).

Each stage prints a line (and appends it to $RLINF_GPU_FIGURES) so a crash names the stage it hit.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from gpu_checks import bf16_regret_bar, engine_greedy, greedy_regret, hf_greedy, record
from test_megatron_actor import actor_config, synthetic_batch, vocab_of
from test_sglang_engine_gpu import PROMPTS, gpu_engine_kwargs


def test_megatron_ipc_sync_in_the_colocated_order(gpu_tiny, sglang_installed, megatron_installed):
    from rlinf.models.hf_checkpoint import load_causal_lm, load_tokenizer
    from rlinf.models.weights import load_weight_bucket
    from rlinf.workers.actor.megatron_actor import MegatronActor
    from rlinf.workers.rollout.sglang_engine import SGLangEngine

    path = Path(os.environ.get("RLINF_GPU_TINY") or gpu_tiny)
    tokenizer = load_tokenizer(str(path))
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    stage = lambda name, **kw: record(f"megatron->sglang sync: {name}", **kw)  # noqa: E731

    engine = SGLangEngine(gpu_engine_kwargs(str(path), graphs=8), where="test engine (megatron sync)")
    try:
        before = engine_greedy(engine, prompts, eos, pad)
        stage("engine up, first generate done")
        actor = MegatronActor(actor_config(path, "bf16", lr=1e-3))
        stage("megatron actor built")
        engine.release()
        batch = synthetic_batch(vocab_of(path), seed=5)
        for step in range(3):  # big steps: the greedy outputs must move
            actor.train(batch, step=step, logprobs=actor.compute_logprobs(batch))
        stage("trained 3 steps")
        trained = actor.named_weights()
        engine.resume(["weights"])
        actor.weight_export("begin", 4 * 1024 * 1024)
        layouts = []
        while (layout := actor.weight_export("next_bucket")) is not None:
            layouts.append(layout)
            engine.load_tensors([actor.weight_export("ipc_handle")], flattened=True)
        engine.flush_cache()
        actor.weight_export("end")
        stage("IPC buckets loaded", buckets=len(layouts))
        freed = actor.offload()["actor/offload_freed_gib"]
        engine.resume()
        stage("actor offloaded, engine resumed", freed_gib=round(freed, 3))
        served = engine_greedy(engine, prompts, eos, pad)
        stage("generate after sync done")
    finally:
        engine.shutdown()
    model = load_causal_lm(str(path), precision="bf16", device=torch.device("cuda"))
    load_weight_bucket(model, trained.items())
    expected = hf_greedy(model, prompts, eos, pad)
    reference = model.float()  # the trained weights as the engine holds them, in fp32
    bar, hf_regret = bf16_regret_bar(reference, prompts, expected)
    regret = greedy_regret(reference, prompts, served)  # HF's greedy choices up to bf16 near-ties
    stage(
        "result",
        greedy_rows_equal=sum(a == b for a, b in zip(served, expected, strict=True)),
        rows=len(expected),
        greedy_regret=regret,
        hf_bf16_greedy_regret=hf_regret,
        changed_vs_before=sum(a != b for a, b in zip(served, before, strict=True)),
    )
    assert regret <= bar, (regret, hf_regret)
    assert served != before
