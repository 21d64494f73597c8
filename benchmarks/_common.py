"""Shared pieces of the GPU benchmarks: the Moonlight slice, timing, bandwidth, FLOPs, JSON.

Every benchmark prints one JSON object (`emit`) whose figures and same-run references come from
the same process. Benchmarks run from the project root as `python -m benchmarks.<name>`.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# NVIDIA H200 SXM dense bf16 tensor-core peak (no sparsity), the denominator of every MFU here.
H200_BF16_PEAK_FLOPS = 989.4e12


def ensure_tokenizer(model_dir: str | Path) -> None:
    """The HF actor loads a tokenizer with its model; a random slice has none. The benchmarks feed
    token ids, so any tokenizer does: write the tiny model's character tokenizer where none is."""
    if list(Path(model_dir).glob("tokenizer*")):
        return
    from rlinf.data.synthetic import SYNTHETIC_CHARSET
    from rlinf.models.tiny_tokenizer import build_char_tokenizer

    build_char_tokenizer(SYNTHETIC_CHARSET).save_pretrained(str(model_dir))


ROOT = Path(__file__).resolve().parent.parent


_STARTED: list[subprocess.Popen] = []  # every run start_recipe started in this process


def start_recipe(
    recipe: str, overrides: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`examples/reasoning/main_grpo.py RECIPE OVERRIDES...` as a user runs it, output into `log`, in a
    process group of its own so that `kill_run` stops the whole run (Ray workers, engines) together."""
    cmd = [sys.executable, str(ROOT / "examples/reasoning/main_grpo.py"), recipe, *overrides]
    with Path(log).open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, process_group=0, env=env)
    _STARTED.append(proc)
    return proc


def kill_run(proc: subprocess.Popen, drain_seconds: float = 0.0) -> None:
    """Stops a run `start_recipe` started, with its whole process group (Ray workers, engines): with
    `drain_seconds`, a SIGTERM first (the run drains and shuts its workers down) and that long to
    end; then SIGKILL to whatever is left of the group, the driver or a worker that outlived it."""
    if drain_seconds and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=drain_seconds)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is gone
        pass
    proc.wait()


def stop_runs_on_sigterm() -> None:
    """A SIGTERM to this benchmark (a caller's `timeout`) stops the runs it started too: in groups of
    their own they would not hear it, and would hold the GPU after the benchmark is gone."""

    def stop(signum: int, _frame: object) -> None:
        for proc in _STARTED:
            kill_run(proc)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


class GcTime:
    """While active: the seconds Python's cyclic garbage collector ran and its collections by
    generation (gc.callbacks). A host-bound call pays for every collection that lands in it."""

    def __enter__(self) -> GcTime:
        self.seconds, self.collections, self._started = 0.0, [0, 0, 0], None
        gc.callbacks.append(self._on)
        return self

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1
            self._started = None

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on)


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result, sort_keys=False), flush=True)


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call, the device drained before and after."""
    sync()
    start = time.perf_counter()
    result = fn()
    sync()
    return time.perf_counter() - start, result


def best_of(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    return min(timed(fn)[0] for _ in range(repeats))


def device_copy_bandwidth(num_bytes: int = 4 * 2**30, repeats: int = 5) -> float:
    """Bytes moved per second (read + write) by one large device-to-device copy, best of `repeats`."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = best_of(lambda: dst.copy_(src), repeats, warmup=2)
    src = dst = torch.empty(0)  # free the 2 x 4 GiB before the benchmark proper
    torch.cuda.empty_cache()
    return 2 * num_bytes / seconds


def slice_model(
    num_layers: int = 4, *, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0
):
    """The Moonlight-shaped slice (rlinf.models.slice's config), seeded random, built in memory."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from rlinf.models.slice import moonlight_slice_config

    fields = {
        k: v
        for k, v in moonlight_slice_config(num_layers).items()
        if k not in ("architectures", "model_type")
    }
    rope_theta = fields.pop("rope_theta")
    config = DeepseekV3Config(**fields, rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    torch.manual_seed(seed)
    with torch.device(device):
        model = DeepseekV3ForCausalLM(config)
    return model.to(dtype).eval()


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def forward_flops_per_token(config, context: int) -> float:
    """Matmul FLOPs of one token's forward through a DeepSeek-V3 (MLA, MoE) model, `context` tokens
    attended on average (causal: about half the sequence), lm_head included, embedding lookup not."""
    h, heads = config.hidden_size, config.num_attention_heads
    qk, v = config.qk_nope_head_dim + config.qk_rope_head_dim, config.v_head_dim
    q = (
        h * heads * qk
        if config.q_lora_rank is None
        else h * config.q_lora_rank + config.q_lora_rank * heads * qk
    )
    attention = q + h * (config.kv_lora_rank + config.qk_rope_head_dim)
    attention += config.kv_lora_rank * heads * (config.qk_nope_head_dim + v) + heads * v * h
    attention_scores = heads * (qk + v) * context  # q.k and p.v per attended token
    dense_mlp = 3 * h * config.intermediate_size
    active_experts = config.num_experts_per_tok + config.n_shared_experts
    moe_mlp = 3 * h * config.moe_intermediate_size * active_experts + h * config.n_routed_experts
    dense_layers = config.first_k_dense_replace
    moe_layers = config.num_hidden_layers - dense_layers
    params = config.num_hidden_layers * attention + dense_layers * dense_mlp + moe_layers * moe_mlp
    params += h * config.vocab_size  # lm_head
    return 2.0 * params + 2.0 * config.num_hidden_layers * attention_scores


def mfu(tokens_per_s: float, flops_per_token: float, peak: float = H200_BF16_PEAK_FLOPS) -> float:
    return tokens_per_s * flops_per_token / peak


def gib(num_bytes: float) -> float:
    return round(num_bytes / 2**30, 2)


def release(actor) -> None:
    """Free the actor's GPU memory before the next actor is measured, so that each one's peak is its
    own. `del` alone does not: megatron-core's DDP and optimizer stay reachable from the gradient
    hooks they put on autograd nodes, which the collector cannot see through. Offloading moves their
    buffers and state to the host, where the leak costs only host memory."""
    actor.offload()
    del actor
    gc.collect()
    torch.cuda.empty_cache()
