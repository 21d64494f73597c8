"""One emulated rank of the Moonlight recipe's layout (TP=8, EP=8, ETP=1, SP) on the CPU, in a child
process: benchmarks/rank_emulation.py makes it rank 0 of 8, which the test session's own one-rank
gloo group (conftest.model_parallel) would forbid in this process.

`run_emulated_rank(workdir)` returns what the child saw:

- `tiny`: the Megatron actor the benchmark's `--emulate-rank` builds (the recipe's actor.model on a
  random Moonlight-shaped checkpoint small enough to train on the CPU: 16 heads, 64 experts top-6),
  each module group's parameter counts, and per forward of each MoE / dense layer the rows its
  router, experts, shared experts, dense MLP and core attention saw; `metrics` of one train call;
- `moonlight`: the parameter counts of the full-size rank built from the Moonlight fixture
  config (random bf16 weights, no load).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import torch

FIXTURE = Path(__file__).parents[1] / "fixtures" / "moonlight-16b-a3b-config.json"
RECIPE = "moonlight-16b-grpo-megatron"
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=16,
    kv_lora_rank=32,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=8,
    vocab_size=512,
)
ROWS, MICRO_BATCH, PROMPT, RESPONSE = 4, 2, 64, 192  # 512 tokens a micro-batch, 64 a rank's SP chunk


def run_emulated_rank(workdir: Path) -> dict:
    import torch.multiprocessing as mp

    workdir.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_child, args=(str(workdir),), nprocs=1, start_method="spawn")
    return torch.load(workdir / "emulated.pt", weights_only=False)


def _child(_rank: int, workdir: str) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))  # the spawned child imports cuda_on_cpu by path
    from cuda_on_cpu import cuda_on_cpu

    from benchmarks.rank_emulation import emulate_rank, end_emulation

    torch.set_num_threads(1)
    work = Path(workdir)
    with cuda_on_cpu():
        emulate_rank(8, tp=8, ep=8, etp=1)
        result = {"tiny": _tiny(work), "moonlight": _moonlight(work)}
        end_emulation()
    torch.save(result, work / "emulated.pt")


def _tiny(work: Path) -> dict:
    from benchmarks.actor_throughput import batch, emulated_model
    from benchmarks.megatron_variants import provider_overrides
    from benchmarks.rank_emulation import EMULATION_SETTINGS, random_weights
    from rlinf.config.schema import ActorConfig, Config, OptimConfig, RunnerConfig
    from rlinf.models.slice import build_random_checkpoint, moonlight_slice_config
    from rlinf.workers.actor.base import with_logprobs
    from rlinf.workers.actor.megatron_actor import MegatronActor

    checkpoint = build_random_checkpoint(work / "tiny", moonlight_slice_config(3, **TINY), dtype="fp32")
    model = emulated_model(RECIPE, str(checkpoint), "fp32")
    cfg = Config(
        runner=RunnerConfig(seed=3),
        actor=ActorConfig(
            training_backend="megatron",
            micro_batch_size=MICRO_BATCH,
            global_batch_size=ROWS,
            seq_length=PROMPT + RESPONSE,
            model=model,
            optim=OptimConfig(lr=1e-4),
        ),
    )
    with provider_overrides(EMULATION_SETTINGS), random_weights():
        actor = MegatronActor(cfg, device="cpu")
    seen: dict[str, list] = {k: [] for k in ("router", "experts", "shared", "dense", "attention")}
    hooks = _record_rows(actor.model[0], seen)
    data = batch(TINY["vocab_size"], ROWS, PROMPT, RESPONSE)
    data = with_logprobs(data, [actor.compute_logprobs(data)])
    metrics = actor.train(replace(data), step=0)
    for hook in hooks:
        hook.remove()
    return {"params": parameter_counts(actor.model[0]), "seen": seen, "metrics": metrics}


def _moonlight(work: Path) -> dict:
    """The full-size rank's parameters, built as the benchmark builds it (bf16, about 4 GB here)."""
    from benchmarks.actor_throughput import emulated_model
    from rlinf.config.megatron_settings import translate
    from rlinf.config.schema import ActorConfig
    from rlinf.models.megatron.bridge import provider_for

    folder = work / "moonlight"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(FIXTURE.read_text())
    actor = ActorConfig(training_backend="megatron", model=emulated_model(RECIPE, str(folder), "bf16"))
    _, provider = provider_for(
        str(folder),
        translate(actor, te_available=False),
        te_available=False,
        trust_remote_code=actor.model.trust_remote_code,
    )
    model = provider.provide_distributed_model(
        wrap_with_ddp=False, use_cpu_initialization=True, init_model_with_meta_device=True, pre_wrap_hook=[]
    )[0]
    return {"params": parameter_counts(model)}


PART = re.compile(r"^(?:module\.)*(embedding|decoder\.layers\.\d+|decoder\.final_layernorm|output_layer)\.")


def parameter_counts(model) -> dict[str, dict[str, int]]:
    """Per part (memory_plan.rank_parts' names), the parameters by how they are split: routed
    experts, TP-split (megatron's `tensor_model_parallel` mark), replicated (the rest)."""
    counts: dict[str, dict[str, int]] = {}
    for name, param in model.named_parameters():
        part = PART.match(name).group(1)
        part = "output" if part in ("decoder.final_layernorm", "output_layer") else part
        kind = (
            "experts"
            if ".mlp.experts." in name
            else "tensor_parallel"
            if getattr(param, "tensor_model_parallel", False)
            else "replicated"
        )
        counts.setdefault(part, {"replicated": 0, "tensor_parallel": 0, "experts": 0})[kind] += param.numel()
    return counts


def _record_rows(model, seen: dict[str, list]) -> list:
    """Forward hooks noting the rows (tokens x batch) each MoE / dense-MLP / attention module saw,
    one entry per forward, in `seen[kind]` (router and experts entries pair up in order)."""

    def rows(tensor) -> int:
        return tensor.numel() // tensor.shape[-1]

    def router(module, args, out):
        local = out[1][:, : module.config.num_moe_experts // 8]  # the routing map; rank 0 holds 0..7
        seen["router"].append(
            {"rows": rows(args[0]), "logits": out[1].shape[-1], "local_picks": int(local.sum())}
        )

    def experts(module, args, out):
        seen["experts"].append(args[0].shape[0])

    def gathered(kind):
        def hook(module, args, out):
            seen[kind].append(rows(out[0]))

        return hook

    def attention(module, args, out):
        query = args[0]  # [s, b, heads, dim]
        seen["attention"].append({"rows": query.shape[0] * query.shape[1], "heads": query.shape[2]})

    hooks = []
    for name, module in model.named_modules():
        if name.endswith("mlp.router"):
            hooks.append(module.register_forward_hook(router))
        elif name.endswith("mlp.experts"):
            hooks.append(module.register_forward_hook(experts))
        elif name.endswith("shared_experts.linear_fc1"):
            hooks.append(module.register_forward_hook(gathered("shared")))
        elif re.search(r"layers\.0\.mlp\.linear_fc1$", name):
            hooks.append(module.register_forward_hook(gathered("dense")))
        elif name.endswith("self_attention.core_attention"):
            hooks.append(module.register_forward_hook(attention))
    return hooks
