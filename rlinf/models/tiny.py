"""The tiny DeepSeek-V3-shaped model that runs the whole RL loop on a laptop CPU.

It has Moonlight-16B-A3B's structure at a thousandth of the width: MLA without a query LoRA
(q_lora_rank null) but with a KV LoRA and separate nope/rope/value head dims, a dense first layer,
then MoE layers with routed experts, top-k sigmoid routing with a correction bias (noaux_tc),
shared experts, one expert group and a routed scaling factor. A short supervised warm start on the
synthetic arithmetic task leaves it partly right, so that GRPO has something to improve.

    python -m rlinf.models.tiny --out DIR [--steps N] [--seed S] [--device cuda]

`tiny://bootstrap` in a recipe resolves to a cached build (`ensure_tiny_checkpoint`). The warm start
runs on the GPU where the process sees one (GPU-tiny's: about a minute there, 17 on one CPU core),
in a child process, so that the caller (a run's driver) holds no CUDA context afterwards; else on one
CPU thread, where a build is reproducible to the bit.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

# Bump when a change to this package changes what a build with the same settings produces.
TINY_CODE_VERSION = 2
TINY_URI = "tiny://bootstrap"
# The same model with MLA dims SGLang's triton MLA kernel compiles for (GPU_TINY_SETTINGS).
TINY_GPU_URI = "tiny://bootstrap-gpu"
BUILD_REPORT = "tiny_build.json"


@dataclass(frozen=True)
class TinyModelSettings:
    # Architecture (Moonlight's structure, scaled down)
    hidden_size: int = 128
    num_hidden_layers: int = 4  # layer 0 dense, the rest MoE
    num_attention_heads: int = 4
    intermediate_size: int = 256  # the dense layer's MLP width
    moe_intermediate_size: int = 64  # each routed expert's width; shared experts are n_shared x this
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 2
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    routed_scaling_factor: float = 2.446  # Moonlight's
    max_position_embeddings: int = 512
    # Start kv_b_proj and o_proj at the output scale they have at this class's default MLA dims:
    # their init std (0.02) times sqrt(default fan-in / fan-in). Without it, a latent or value heads
    # wider than the default make attention outputs several times the embeddings' size at init.
    fan_in_scaled_attention_init: bool = False
    # Synthetic task, the tiny CPU recipe's default data. Two-digit operands are out of reach for a
    # CPU-minutes budget (under 10% after 3000 warm-start steps); one digit is learnable.
    digits: int = 1
    operations: tuple[str, ...] = ("+", "-")
    steps: int = 2
    # Supervised warm start, stopped deliberately where greedy accuracy is still climbing
    # (about 40%): GRPO then has room to add 20+ points (docs/models.md).
    num_train_problems: int = 3000  # of the ~3600 distinct train expressions at 1 digit, 2 steps
    num_val_problems: int = 128
    train_steps: int = 400
    # With a target: the warm start stops at the first check (every `check_every` steps) whose greedy
    # accuracy on the validation problems reaches it, `train_steps` being the most it takes. Greedy
    # accuracy at a given step differs by device (near-ties decided by rounding), the target does not.
    target_accuracy: float | None = None
    check_every: int = 50
    batch_size: int = 32
    lr: float = 1e-3  # 3e-3 learns more slowly here and 1e-2 not at all
    warmup_steps: int = 20
    seed: int = 0

    def digest(self) -> str:
        """Names a build: every setting, the tokenizer charset and the code version."""
        from rlinf.data.synthetic import SYNTHETIC_CHARSET

        payload = {
            "settings": dataclasses.asdict(self),
            "charset": SYNTHETIC_CHARSET,
            "code": TINY_CODE_VERSION,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


# The same structure smaller still, for tests that need a real DeepSeek-V3 (checkpoint layout, MLA,
# MoE routing) in milliseconds rather than a model that has learned anything.
SMALL_SETTINGS = TinyModelSettings(
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    intermediate_size=64,
    moe_intermediate_size=16,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=8,
)

# The tiny model with MLA dims SGLang's triton kernels handle (`tiny://bootstrap-gpu`): the MLA decode
# kernel compiles only kv_lora_rank + qk_rope_head_dim = 288 or 576, and a 64-wide value head keeps the
# extend-attention kernel off 32-wide tiles (an illegal memory access on a machine's second run, seen
# with v 32; docs/sglang.md). At the plain init those wider dims make its attention outputs 3-7x the
# default's, and it learns about half as fast, in the warm start and in GRPO (docs/models.md): its
# build scales them back (fan_in_scaled_attention_init). Its task adds `*` to + and -: the val
# split then holds ~900 expressions, enough for the 512 val problems of `tiny-moe-grpo-gpu`. Its
# warm start stops once greedy accuracy reaches 40% (650 steps on the 2-core CPU, 750 on an H100:
# the same steps reach different accuracies by device); docs/models.md has the curves.
GPU_TINY_SETTINGS = TinyModelSettings(
    kv_lora_rank=256,
    qk_rope_head_dim=32,
    v_head_dim=64,
    operations=("+", "-", "*"),
    num_train_problems=6000,
    num_val_problems=512,
    train_steps=1000,
    target_accuracy=0.4,
    fan_in_scaled_attention_init=True,
)


def deepseek_v3_config(settings: TinyModelSettings, *, vocab_size: int, **overrides: Any) -> DeepseekV3Config:
    """A DeepSeek-V3 config of Moonlight's structure at the sizes in `settings`.

    `overrides` are further DeepseekV3Config fields (token ids, `initializer_range`, ...) and win over
    the ones set here.
    """
    from transformers import DeepseekV3Config

    fields: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        moe_intermediate_size=settings.moe_intermediate_size,
        num_hidden_layers=settings.num_hidden_layers,
        num_attention_heads=settings.num_attention_heads,
        num_key_value_heads=settings.num_attention_heads,
        n_routed_experts=settings.n_routed_experts,
        num_experts_per_tok=settings.num_experts_per_tok,
        n_shared_experts=settings.n_shared_experts,
        routed_scaling_factor=settings.routed_scaling_factor,
        q_lora_rank=None,
        kv_lora_rank=settings.kv_lora_rank,
        qk_nope_head_dim=settings.qk_nope_head_dim,
        qk_rope_head_dim=settings.qk_rope_head_dim,
        v_head_dim=settings.v_head_dim,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        num_nextn_predict_layers=0,
        tie_word_embeddings=False,
        max_position_embeddings=settings.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        rms_norm_eps=1e-5,
        # Not read by transformers (its routing is always this), but by other DeepSeek-V3 readers
        # (SGLang, Megatron-Bridge), as in Moonlight's config.json.
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        moe_layer_freq=1,
        ep_size=1,
    )
    return DeepseekV3Config(**(fields | overrides))


def tiny_model_config(settings: TinyModelSettings, tokenizer: PreTrainedTokenizerFast) -> DeepseekV3Config:
    return deepseek_v3_config(
        settings,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def random_deepseek_v3(
    settings: TinyModelSettings, *, vocab_size: int, seed: int = 0, **overrides: Any
) -> DeepseekV3ForCausalLM:
    """A seeded random fp32 model of `deepseek_v3_config(settings, ...)`, in eval mode.

    For tests and benchmarks that need a real DeepSeek-V3 forward pass, not one that has learned anything.
    """
    return _seeded_model(
        settings, deepseek_v3_config(settings, vocab_size=vocab_size, **overrides), seed
    ).float()


def _seeded_model(settings: TinyModelSettings, config: DeepseekV3Config, seed: int) -> DeepseekV3ForCausalLM:
    """The model of `config` initialised from `seed`, with `settings`' init rules, in eval mode."""
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config).eval()
    if settings.fan_in_scaled_attention_init:
        scale_attention_init(model, settings)
    return model


def scale_attention_init(model: PreTrainedModel, settings: TinyModelSettings) -> None:
    """Scale `model`'s freshly initialised kv_b_proj and o_proj weights in place, so that each
    projection's output has the size it has at the default MLA dims (`fan_in_scaled_attention_init`)."""
    default = TinyModelSettings()
    kv_b = (default.kv_lora_rank / settings.kv_lora_rank) ** 0.5
    o = (
        default.num_attention_heads
        * default.v_head_dim
        / (settings.num_attention_heads * settings.v_head_dim)
    ) ** 0.5
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.kv_b_proj.weight.mul_(kv_b)
            layer.self_attn.o_proj.weight.mul_(o)


def build_tiny_checkpoint(
    out_dir: str | Path,
    settings: TinyModelSettings = TinyModelSettings(),
    *,
    bootstrap: bool = True,
    device: str = "cpu",
) -> Path:
    """Write the tiny model, tokenizer, generation config and a build report to `out_dir`.

    With `bootstrap`, the model is warm-started on the synthetic task (on `device`) and its greedy
    validation accuracy is measured into `tiny_build.json`; without, it keeps its seeded random init.
    """
    from transformers import GenerationConfig

    from rlinf.data.synthetic import SYNTHETIC_CHARSET
    from rlinf.models.tiny_tokenizer import build_char_tokenizer

    started = time.perf_counter()
    tokenizer = build_char_tokenizer(SYNTHETIC_CHARSET)
    model = _seeded_model(settings, tiny_model_config(settings, tokenizer), settings.seed)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    report: dict[str, object] = {
        "settings": dataclasses.asdict(settings),
        "code_version": TINY_CODE_VERSION,
        "parameters": sum(p.numel() for p in model.parameters()),
        "bootstrapped": bootstrap,
    }
    if bootstrap:
        report["warm_start_device"] = device
        if device == "cpu":
            with single_thread():
                report |= _bootstrap(model, tokenizer, settings)
        else:
            report |= _bootstrap(model.to(device), tokenizer, settings)
            model.to("cpu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    report["build_seconds"] = round(time.perf_counter() - started, 1)
    (out / BUILD_REPORT).write_text(json.dumps(report, indent=2) + "\n")
    return out


def _bootstrap(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, settings: TinyModelSettings
) -> dict[str, float]:
    """Warm-start `model` in place; the figures that go into the build report."""
    from rlinf.data.synthetic import generate_arithmetic
    from rlinf.models.bootstrap import GreedyEval, greedy_accuracy, supervised_warm_start

    task = {"digits": settings.digits, "operations": settings.operations, "steps": settings.steps}
    train = generate_arithmetic("train", settings.num_train_problems, seed=settings.seed, **task)
    val = generate_arithmetic("val", settings.num_val_problems, seed=settings.seed, **task)
    checks: list[tuple[int, float]] = []
    last_check: dict[int, GreedyEval] = {}  # steps -> that check's evaluation, final if it ends there

    def reached_target(steps: int) -> bool:
        last_check.clear()
        last_check[steps] = greedy_accuracy(model, tokenizer, val)
        checks.append((steps, last_check[steps].accuracy))
        return checks[-1][1] >= settings.target_accuracy

    losses = supervised_warm_start(
        model,
        tokenizer,
        train,
        steps=settings.train_steps,
        batch_size=settings.batch_size,
        lr=settings.lr,
        warmup_steps=settings.warmup_steps,
        seed=settings.seed,
        stop=None if settings.target_accuracy is None else reached_target,
        check_every=settings.check_every,
    )
    evaluation = last_check.get(len(losses)) or greedy_accuracy(model, tokenizer, val)
    report = {
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "val_greedy_accuracy": evaluation.accuracy,
        "val_boxed_fraction": evaluation.boxed_fraction,
        "warm_start_steps": len(losses),
    }
    if settings.target_accuracy is not None:
        report["warm_start_checks"] = checks  # (steps, greedy val accuracy)
    return report


@contextmanager
def single_thread() -> Iterator[None]:
    """Run the warm start on one thread, whatever the process uses otherwise.

    The tiny model's matrices are too small for intra-op threads to pay: on a quiet 2-core
    machine two threads gain little, and next to other busy processes (Ray workers, tests) they
    made each step about 16 times slower, waiting at OpenMP barriers for a descheduled thread.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def ensure_tiny_checkpoint(
    settings: TinyModelSettings = TinyModelSettings(), cache_dir: str | Path | None = None
) -> Path:
    """The bootstrapped tiny checkpoint for `settings`, built once and then reused from the cache.

    Lives in `<cache>/tiny/<digest>`, with `<cache>` = `cache_dir`, else `$RLINF_CACHE_DIR`, else
    `~/.cache/rlinf`. The build goes to a temporary folder renamed into place when complete, and a
    lock file makes concurrent callers (several Ray workers) wait for one build instead of racing.
    """
    root = Path(cache_dir or os.environ.get("RLINF_CACHE_DIR") or Path.home() / ".cache" / "rlinf") / "tiny"
    final = root / settings.digest()
    if (final / BUILD_REPORT).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / BUILD_REPORT).is_file():
            # Only the lock holder builds, so one staging name suffices; a crashed build's leftovers
            # are cleared here by the next builder.
            staging = root / f".{final.name}.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            device = warm_start_device()
            if device == "cpu":
                build_tiny_checkpoint(staging, settings)
            else:
                build_in_child(staging, settings, device)
            staging.rename(final)
    return final


def warm_start_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_in_child(out_dir: Path, settings: TinyModelSettings, device: str) -> Path:
    """`build_tiny_checkpoint` in a child process (`python -m rlinf.models.tiny`): its CUDA context
    and memory end with it. The child finds this checkout's rlinf whether or not it is installed."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "rlinf.models.tiny", "--out", str(out_dir), "--device", device]
    subprocess.run([*cmd, "--settings-json", json.dumps(dataclasses.asdict(settings))], env=env, check=True)
    return Path(out_dir)


def settings_from_json(text: str) -> TinyModelSettings:
    fields = json.loads(text)
    return TinyModelSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def resolve_model_path(path: str) -> str:
    """`tiny://bootstrap` -> the cached tiny checkpoint (built on first use); other paths unchanged."""
    if path == TINY_URI:
        return str(ensure_tiny_checkpoint())
    if path == TINY_GPU_URI:
        return str(ensure_tiny_checkpoint(GPU_TINY_SETTINGS))
    if path.startswith("tiny://"):
        raise ValueError(f"unknown tiny model {path!r}; choose {TINY_URI} or {TINY_GPU_URI}")
    return path


def main(argv: Sequence[str] | None = None) -> None:
    defaults = TinyModelSettings()
    parser = argparse.ArgumentParser(description="Build the tiny DeepSeek-V3-shaped checkpoint.")
    parser.add_argument("--out", required=True, help="output checkpoint directory")
    parser.add_argument("--steps", type=int, default=defaults.train_steps, help="warm-start optimizer steps")
    parser.add_argument("--lr", type=float, default=defaults.lr, help="warm-start peak learning rate")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="warm-start batch size")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="init, data and order seed")
    parser.add_argument("--no-bootstrap", action="store_true", help="keep the random init (no warm start)")
    parser.add_argument("--device", default=None, help="the warm start's device (default: cuda if present)")
    parser.add_argument(
        "--settings-json", help="every TinyModelSettings field (the flags above then ignored)"
    )
    args = parser.parse_args(argv)
    settings = dataclasses.replace(
        defaults, train_steps=args.steps, lr=args.lr, batch_size=args.batch_size, seed=args.seed
    )
    if args.settings_json:
        settings = settings_from_json(args.settings_json)
    device = args.device or warm_start_device()
    if device != "cpu":  # as reproducible as the GPU allows: deterministic kernels where torch has them
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    out = build_tiny_checkpoint(args.out, settings, bootstrap=not args.no_bootstrap, device=device)
    print((out / BUILD_REPORT).read_text(), end="")


if __name__ == "__main__":
    main()
