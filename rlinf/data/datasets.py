"""Tokenised prompts: `MathRecord`s rendered (optionally through the chat template) into token ids."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

from rlinf.data.records import DatasetError, MathRecord

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptItem:
    prompt_ids: tuple[int, ...]  # exactly what the rollout is given; no special tokens added on top
    prompt_text: str  # the rendered text those ids encode
    solutions: tuple[str, ...]
    source: str  # where the record came from, for error messages and debugging


class PromptDataset(Sequence[PromptItem]):
    """The prompts that fit `max_prompt_length`; `num_filtered` counts those that did not."""

    def __init__(self, items: list[PromptItem], num_filtered: int) -> None:
        self._items = items
        self.num_filtered = num_filtered

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> PromptItem: ...

    @overload
    def __getitem__(self, index: slice) -> list[PromptItem]: ...

    def __getitem__(self, index: int | slice) -> PromptItem | list[PromptItem]:
        return self._items[index]


def build_prompt_dataset(
    records: Sequence[MathRecord],
    tokenizer: PreTrainedTokenizerBase,
    *,
    apply_chat_template: bool,
    max_prompt_length: int,
    where: str = "data",
) -> PromptDataset:
    """Render and tokenise every record; drop (and count, with one warning) prompts that are too long.

    `where` names the data in messages (e.g. "data.train_data_paths (gsm8k.jsonl)")."""
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    if apply_chat_template and not tokenizer.chat_template:
        raise DatasetError(
            f"{where}: data.apply_chat_template is true but the tokenizer has no chat_template"
        )
    texts = [_render_prompt(record, tokenizer, apply_chat_template) for record in records]
    # The text is final: a template already wrote any BOS it wants, so adding special tokens here
    # would double it, and untemplated prompts are used exactly as written.
    all_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    _warn_unknown_tokens(tokenizer, texts, all_ids, where)
    items = [
        PromptItem(prompt_ids=tuple(ids), prompt_text=text, solutions=record.solutions, source=record.source)
        for record, text, ids in zip(records, texts, all_ids, strict=True)
        if len(ids) <= max_prompt_length
    ]
    num_filtered = len(records) - len(items)
    if records and not items:
        shortest = min(len(ids) for ids in all_ids)
        raise DatasetError(
            f"{where}: all {len(records)} prompts are longer than data.max_prompt_length={max_prompt_length} "
            f"tokens (the shortest has {shortest}); raise data.max_prompt_length, and actor.seq_length to "
            "at least data.max_prompt_length + algorithm.sampling_params.max_new_tokens"
        )
    if num_filtered:
        logger.warning(
            "dropped %d of %d prompts longer than max_prompt_length=%d tokens",
            num_filtered,
            len(records),
            max_prompt_length,
        )
    return PromptDataset(items, num_filtered)


def _warn_unknown_tokens(tokenizer, texts: list[str], all_ids: list[list[int]], where: str) -> None:
    """Text the tokenizer cannot represent becomes its unknown token: the model then sees one symbol
    for all of it. Say so once, with examples (the tiny model's character tokenizer knows only the
    characters of its arithmetic task, so ordinary prose is mostly unknown to it)."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return
    affected = [i for i, ids in enumerate(all_ids) if unk in ids]
    if not affected:
        return
    total = sum(len(ids) for ids in all_ids)
    unknown = sum(ids.count(unk) for ids in all_ids)
    examples: dict[str, None] = {}
    if tokenizer.is_fast:  # offsets map each unknown token back to the text it stands for
        for i in affected[:20]:
            encoded = tokenizer(texts[i], add_special_tokens=False, return_offsets_mapping=True)
            for token, (start, end) in zip(encoded["input_ids"], encoded["offset_mapping"], strict=True):
                if token == unk:
                    examples[texts[i][start:end]] = None
    shown = ", ".join(repr(e) for e in list(examples)[:12])
    logger.warning(
        "%s: %d of %d prompt tokens (%.1f%%, in %d of %d prompts) are text the tokenizer does not know and "
        "became %s%s; the model cannot read that text",
        where,
        unknown,
        total,
        100.0 * unknown / max(total, 1),
        len(affected),
        len(texts),
        tokenizer.unk_token,
        f" (e.g. {shown})" if shown else "",
    )


def _render_prompt(record: MathRecord, tokenizer: PreTrainedTokenizerBase, apply_chat_template: bool) -> str:
    if not apply_chat_template:
        if not isinstance(record.prompt, str):
            raise DatasetError(
                f"{record.source}: the prompt is a list of chat messages; set data.apply_chat_template=true"
            )
        return record.prompt
    messages = (
        [{"role": "user", "content": record.prompt}]
        if isinstance(record.prompt, str)
        else [dict(message) for message in record.prompt]
    )
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert isinstance(text, str)  # tokenize=False always returns the rendered string
    return text
