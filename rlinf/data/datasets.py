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
) -> PromptDataset:
    """Render and tokenise every record; drop (and count, with one warning) prompts that are too long."""
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    if apply_chat_template and not tokenizer.chat_template:
        raise ValueError("data.apply_chat_template is true but the tokenizer has no chat_template")
    texts = [_render_prompt(record, tokenizer, apply_chat_template) for record in records]
    # The text is final: a template already wrote any BOS it wants, so adding special tokens here
    # would double it, and untemplated prompts are used exactly as written.
    all_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    items = [
        PromptItem(prompt_ids=tuple(ids), prompt_text=text, solutions=record.solutions, source=record.source)
        for record, text, ids in zip(records, texts, all_ids, strict=True)
        if len(ids) <= max_prompt_length
    ]
    num_filtered = len(records) - len(items)
    if records and not items:
        raise DatasetError(
            f"all {len(records)} prompts are longer than max_prompt_length={max_prompt_length}"
        )
    if num_filtered:
        logger.warning(
            "dropped %d of %d prompts longer than max_prompt_length=%d tokens",
            num_filtered,
            len(records),
            max_prompt_length,
        )
    return PromptDataset(items, num_filtered)


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
