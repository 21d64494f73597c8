"""One colocated GRPO step on one GPU, split by phase, with GPU memory per phase, through the real
worker pieces (TorchRollout, RewardWorker, TorchActor, compute_advantages; no Ray: the driver calls
the workers directly, as colocated workers would be called). Also the scaling sweep: step time
against response length and rollout batch size, and a plot of it.

Phases, in order: rollout (generate), offload/onload (rollout model to host, actor to GPU and
back), reward, logprob recompute, train (forward+backward+AdamW over the whole batch), weight sync
(bucketed export from the actor, load into the rollout). The step's first run is a warm-up and is
not reported. Memory: peak allocated during the phase and allocated at its end (torch allocator).

    python benchmarks/grpo_step_phases.py [--checkpoint DIR] [--prompts 8] [--group-size 8]
        [--new-tokens 256] [--sweep-new-tokens 128,256,512] [--sweep-batches 32,64,128] [--plot docs/x.png]
    python benchmarks/grpo_step_phases.py --smoke  # CPU, tiny random model: checks the script only
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import emit, environment, gib  # noqa: E402

from rlinf.algorithms import compute_advantages  # noqa: E402
from rlinf.config.schema import Config  # noqa: E402
from rlinf.data.datasets import PromptItem  # noqa: E402
from rlinf.workers.rollout.sampling import SamplingParams  # noqa: E402


def replaced(obj: Any, **fields: Any) -> Any:
    """dataclasses.replace with dotted names: replaced(cfg, **{"actor.micro_batch_size": 8})."""
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for key, value in fields.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[head] = value
    for head, sub in nested.items():
        flat[head] = replaced(getattr(obj, head), **sub)
    return dataclasses.replace(obj, **flat)


def word_level_tokenizer(checkpoint: Path, vocab_size: int, eos_id: int) -> None:
    """A tokenizer with one token per id ("t123"): the random slice has none, and the rollout decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"t{eos_id}", pad_token="t0")
    fast.save_pretrained(checkpoint)


def build_checkpoint(path: Path, smoke: bool) -> Path:
    if (path / "tokenizer.json").is_file():
        return path
    if smoke:
        from rlinf.models.tiny import SMALL_SETTINGS, random_deepseek_v3

        model = random_deepseek_v3(SMALL_SETTINGS, vocab_size=512, eos_token_id=1, pad_token_id=0)
        model.save_pretrained(path)
        word_level_tokenizer(path, 512, 1)
        return path
    from rlinf.models.slice import build_moonlight_slice, moonlight_slice_config

    build_moonlight_slice(path, 4, dtype="bf16", device="cuda")
    fields = moonlight_slice_config(4)
    word_level_tokenizer(path, fields["vocab_size"], fields["eos_token_id"])
    return path


class Phases:
    """Wall time (device drained) and GPU memory of each named phase of one step."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.seconds: dict[str, float] = {}
        self.memory: dict[str, dict[str, float]] = {}

    def run(self, name: str, fn):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        result = fn()
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        if self.cuda:
            peak = max(self.memory.get(name, {}).get("peak_GiB", 0.0), gib(torch.cuda.max_memory_allocated()))
            self.memory[name] = {"peak_GiB": peak, "end_GiB": gib(torch.cuda.memory_allocated())}
        return result


def grpo_step(
    cfg: Config, rollout, reward, actor, prompts, step: int, cuda: bool, offload: bool
) -> dict[str, Any]:
    a = cfg.algorithm
    phases = Phases(cuda)
    params = SamplingParams.from_config(a.sampling_params)
    started = time.perf_counter()
    batch = phases.run("rollout", lambda: rollout.generate(prompts, a.group_size, params, seed=step))
    if offload:
        phases.run("offload_onload", lambda: (rollout.sleep(), actor.onload()))
    batch = phases.run("reward", lambda: reward.score(batch))
    advantages = compute_advantages(
        a.adv_type, batch.rewards, batch.group_index, normalize=a.normalize_advantages
    )
    batch = dataclasses.replace(batch, advantages=advantages.advantages)
    batch = phases.run("logprobs", lambda: actor.compute_logprobs(batch))
    phases.run("train", lambda: actor.train(batch, step))
    buckets = phases.run(
        "weight_sync", lambda: actor.export_weights(cfg.rollout.weight_sync_bucket_mb * 2**20)
    )
    if offload:
        phases.run("offload_onload", lambda: (actor.offload(), rollout.wake()))
    phases.run("weight_sync", lambda: rollout.update_weights(buckets))
    total = time.perf_counter() - started
    response_tokens = int(batch.response_mask.sum())
    mismatch = (batch.rollout_logprobs - batch.old_logprobs).abs()[batch.response_mask.bool()]
    return {
        "responses": len(batch.finish_reasons),
        "response_tokens": response_tokens,
        "step_seconds": round(total, 3),
        "response_tokens_per_s": round(response_tokens / total, 1),
        "phase_seconds": {k: round(v, 3) for k, v in phases.seconds.items()},
        "phase_share": {k: round(v / total, 3) for k, v in phases.seconds.items()},
        "phase_memory": phases.memory,
        "rollout_vs_recompute_logprob_mean_abs_diff": round(float(mismatch.mean()), 5),
    }


def make_config(checkpoint: Path, args, new_tokens: int, responses: int) -> Config:
    return replaced(
        Config(),
        **{
            "actor.model.model_path": str(checkpoint),
            "rollout.model.model_path": str(checkpoint),
            "actor.model.precision": args.precision,
            "rollout.model.precision": args.precision,
            "actor.micro_batch_size": args.micro_batch,
            "actor.global_batch_size": responses,
            "rollout.max_batch_size": 256,
            "algorithm.group_size": args.group_size,
            "algorithm.sampling_params": replaced(
                Config().algorithm.sampling_params,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # fixed lengths: every response is exactly new_tokens long
            ),
            "reward.num_workers": 2,
        },
    )


def prompts_for(num: int, length: int, vocab: int, seed: int) -> list[PromptItem]:
    ids = torch.randint(2, vocab, (num, length), generator=torch.Generator().manual_seed(seed)).tolist()
    return [PromptItem(tuple(row), "", ("1",), "benchmark") for row in ids]


def plot(sweep: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in (
        (axes[0], "new_tokens", "response length (tokens)"),
        (axes[1], "responses", "responses per step"),
    ):
        rows = sorted((r for r in sweep if r["varied"] == key), key=lambda r: r[key])
        if not rows:
            continue
        xs = [r[key] for r in rows]
        bottom = [0.0] * len(rows)
        for phase in ("rollout", "reward", "logprobs", "train", "weight_sync", "offload_onload"):
            ys = [r["phase_seconds"].get(phase, 0.0) for r in rows]
            ax.bar([str(x) for x in xs], ys, bottom=bottom, label=phase)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
        ax.set_xlabel(label)
        ax.set_ylabel("step seconds")
        fixed = rows[0]
        other = (
            f"{fixed['responses']} responses" if key == "new_tokens" else f"{fixed['new_tokens']} new tokens"
        )
        ax.set_title(f"colocated GRPO step, 1 GPU ({other})")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def progress(t0: float, what: str) -> None:
    print(f"[{time.perf_counter() - t0:7.1f} s] {what}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="/tmp/rlinf-bench/moonlight-slice-4l-tok")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument(
        "--sweep-new-tokens", default="", help="comma list, at --prompts x --group-size responses"
    )
    parser.add_argument(
        "--sweep-batches", default="", help="comma list of responses per step, at --new-tokens"
    )
    parser.add_argument("--plot", default="")
    parser.add_argument(
        "--resident",
        action="store_true",
        help="no offload/onload: both models and the optimizer stay on the GPU",
    )
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()

    cuda = not args.smoke
    if args.smoke:
        args.checkpoint = "/tmp/rlinf-bench/smoke-tiny"
    t0 = time.perf_counter()
    checkpoint = build_checkpoint(Path(args.checkpoint), args.smoke)
    progress(t0, "checkpoint ready")
    from rlinf.workers.actor.torch_actor import TorchActor
    from rlinf.workers.reward.reward_worker import RewardWorker
    from rlinf.workers.rollout.torch_rollout import TorchRollout

    responses = args.prompts * args.group_size
    cfg = make_config(checkpoint, args, args.new_tokens, responses)
    started = time.perf_counter()
    rollout, reward, actor = TorchRollout(cfg), RewardWorker(cfg), TorchActor(cfg)
    load_seconds = time.perf_counter() - started
    progress(t0, "workers loaded")
    vocab = rollout.model.config.vocab_size

    def measure(new_tokens: int, num_responses: int, seed: int) -> dict[str, Any]:
        step_cfg = make_config(checkpoint, args, new_tokens, num_responses)
        for worker in (rollout, actor):
            worker.cfg = step_cfg
        prompts = prompts_for(num_responses // args.group_size, args.prompt_len, vocab, seed)
        return grpo_step(step_cfg, rollout, reward, actor, prompts, seed, cuda, offload=not args.resident)

    measure(min(16, args.new_tokens), responses, 0)  # warm-up: kernels, allocator, reward pool
    progress(t0, "warm-up step done")
    main_step = measure(args.new_tokens, responses, 1)
    result: dict[str, Any] = {
        "hardware": environment(),
        "checkpoint": str(checkpoint),
        "worker_load_seconds": round(load_seconds, 1),
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "resident": args.resident,
        "step": main_step,
        "sweep": [],
    }
    print(main_step, file=sys.stderr, flush=True)
    for i, new_tokens in enumerate(int(x) for x in args.sweep_new_tokens.split(",") if x):
        row = measure(new_tokens, responses, 10 + i) | {"varied": "new_tokens", "new_tokens": new_tokens}
        result["sweep"].append(row)
        print(row, file=sys.stderr, flush=True)
    for i, num in enumerate(int(x) for x in args.sweep_batches.split(",") if x):
        row = measure(args.new_tokens, num, 20 + i) | {"varied": "responses", "new_tokens": args.new_tokens}
        result["sweep"].append(row)
        print(row, file=sys.stderr, flush=True)
    if args.plot and result["sweep"]:
        # The main step is the shared point of both series.
        both = [
            main_step | {"varied": key, "new_tokens": args.new_tokens} for key in ("new_tokens", "responses")
        ]
        plot(result["sweep"] + both, Path(args.plot))
        result["plot"] = args.plot
    reward.close()
    emit(result)


if __name__ == "__main__":
    main()
