"""Train and validation prompt datasets from a recipe's data section.

Every problem with the data (a file, a record, prompts too long, too few prompts for a batch) is a
DatasetError naming the recipe key and the files, raised before any worker starts."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlinf.config.schema import Config
from rlinf.data.datasets import PromptDataset, build_prompt_dataset
from rlinf.data.prompt_loader import prompts_per_step
from rlinf.data.records import DatasetError, MathRecord, load_math_records

if TYPE_CHECKING:
    from rlinf.data.synthetic import ArithmeticProblem, Split

logger = logging.getLogger(__name__)


def _where(cfg: Config, split: str) -> str:
    """Names a split's data for messages: the recipe key and, for files, the files."""
    if cfg.data.type == "synthetic":
        return f"data.synthetic ({split})"
    key = "train_data_paths" if split == "train" else "val_data_paths"
    paths = cfg.data.train_data_paths if split == "train" else cfg.data.val_data_paths
    return f"data.{key} ({', '.join(paths)})"


def synthetic_problems(cfg: Config, split: Split) -> list[ArithmeticProblem]:
    """The run's synthetic problems of `split` (data.synthetic, drawn with runner.seed); a ValueError
    for a task too small for the counts or an unknown operator."""
    from rlinf.data.synthetic import generate_arithmetic

    s = cfg.data.synthetic
    return generate_arithmetic(
        split,
        s.num_train if split == "train" else s.num_val,
        digits=s.digits,
        operations=s.operations,
        steps=s.steps,
        seed=cfg.runner.seed,
    )


def _records(cfg: Config, split: str) -> tuple[list[MathRecord], int]:
    d = cfg.data
    if d.type == "synthetic":
        try:
            problems = synthetic_problems(cfg, "train" if split == "train" else "val")
        except ValueError as err:  # a task too small for the requested counts, unknown operators
            raise DatasetError(f"{_where(cfg, split)}: {err}") from None
        return [p.record for p in problems], 0
    paths = d.train_data_paths if split == "train" else d.val_data_paths
    if not paths:
        return [], 0
    loaded = load_math_records(
        paths, prompt_key=d.prompt_key, answer_key=d.answer_key, skip_invalid=d.skip_invalid
    )
    return loaded.records, loaded.num_skipped


def build_datasets(cfg: Config, tokenizer) -> tuple[PromptDataset, PromptDataset | None, dict[str, float]]:
    """(train, val or None, data/* counters)."""
    counters: dict[str, float] = {}
    datasets: list[PromptDataset | None] = []
    for split in ("train", "val"):
        records, skipped = _records(cfg, split)
        counters[f"data/{split}_skipped_records"] = float(skipped)
        if not records:
            datasets.append(None)
            continue
        dataset = build_prompt_dataset(
            records,
            tokenizer,
            apply_chat_template=cfg.data.apply_chat_template,
            max_prompt_length=cfg.data.max_prompt_length,
            where=_where(cfg, split),
        )
        counters[f"data/{split}_filtered_prompts"] = float(dataset.num_filtered)
        counters[f"data/{split}_prompts"] = float(len(dataset))
        datasets.append(dataset)
    train, val = datasets
    if train is None:
        raise DatasetError(f"{_where(cfg, 'train')}: the training set is empty")
    if len(train) < prompts_per_step(cfg.data):
        extra = cfg.data.oversample_prompts
        raise DatasetError(
            f"{_where(cfg, 'train')}: {len(train)} usable training prompt(s), fewer than "
            f"data.rollout_batch_size={cfg.data.rollout_batch_size}"
            + (f" + data.oversample_prompts={extra}" if extra else "")
            + ": no full batch can be formed"
        )
    logger.info("data: %d training prompts, %d validation prompts", len(train), len(val) if val else 0)
    return train, val, counters
