"""The supervised control for a tiny recipe's GRPO learning curve.

The recipe's checkpoint is fine-tuned on the worked solutions of its own training problems for a few
steps at the recipe's actor learning rate and batch size, and greedy accuracy is measured on the
validation problems the GRPO run validates on (`runner.seed`'s split), before and after. A warm
start stopped at a constant learning rate sits in a noisy spot that a few small steps of any
training settle; a GRPO gain says more than "the loop trains" only beyond what this control reaches.

    python -m benchmarks.supervised_control [--recipe tiny-moe-grpo-cpu] [--steps 20] [overrides ...]

Prints one JSON line: the checkpoint, steps, lr, batch and greedy accuracy before / after.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks._common import emit
from rlinf.config import load_config
from rlinf.models import load_causal_lm, load_tokenizer
from rlinf.models.bootstrap import greedy_accuracy, supervised_warm_start
from rlinf.models.tiny import resolve_model_path, single_thread
from rlinf.runners.data_setup import synthetic_problems


def supervised_control(recipe: str, overrides: list[str], steps: int) -> dict[str, Any]:
    cfg = load_config(recipe, overrides)
    if cfg.data.type != "synthetic":
        raise SystemExit(
            f"error: {recipe} trains on data.type {cfg.data.type}; the control needs the synthetic task"
        )

    train, val = synthetic_problems(cfg, "train"), synthetic_problems(cfg, "val")
    path = resolve_model_path(cfg.actor.model.model_path)
    model, tokenizer = load_causal_lm(path), load_tokenizer(path)
    with single_thread():
        before = greedy_accuracy(model, tokenizer, val).accuracy
        supervised_warm_start(
            model,
            tokenizer,
            train,
            steps=steps,
            batch_size=cfg.actor.global_batch_size,
            lr=cfg.actor.optim.lr,
            warmup_steps=max(cfg.actor.lr_sched.lr_warmup_steps, 1),
            seed=cfg.runner.seed,
        )
        after = greedy_accuracy(model, tokenizer, val).accuracy
    return {
        "benchmark": "supervised_control",
        "recipe": recipe,
        "checkpoint": path,
        "steps": steps,
        "lr": cfg.actor.optim.lr,
        "batch_size": cfg.actor.global_batch_size,
        "val_problems": len(val),
        "seed": cfg.runner.seed,
        "greedy_accuracy_before": before,
        "greedy_accuracy_after": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny-moe-grpo-cpu")
    parser.add_argument("--steps", type=int, default=20, help="supervised steps (default 20)")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, key=value")
    args = parser.parse_args()
    emit(supervised_control(args.recipe, args.overrides, args.steps))


if __name__ == "__main__":
    main()
