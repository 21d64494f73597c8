from __future__ import annotations

import logging

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from rlinf.data.datasets import PromptDataset, PromptItem, build_prompt_dataset
from rlinf.data.prompt_loader import PromptLoader
from rlinf.data.records import DatasetError, MathRecord

SPECIAL_TOKENS = ["<unk>", "<s>", "<|system|>", "<|user|>", "<|assistant|>"]
WORDS = ["Compute", "What", "is", "Be", "brief", "1", "2", "3", "+", "-", ".", "?"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """A word-level tokenizer that, like most chat models', prepends BOS when asked for special tokens."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[2:]})
    tokenizer.chat_template = chat_template
    return tokenizer


def ids_of(tokenizer: PreTrainedTokenizerFast, tokens: list[str]) -> tuple[int, ...]:
    return tuple(tokenizer.convert_tokens_to_ids(tokens))


def test_plain_prompts_are_tokenised_as_written_without_bos() -> None:
    tokenizer = make_tokenizer()
    records = [
        MathRecord("Compute 1 + 2.", ("3",), "a.jsonl:1"),
        MathRecord("What is 3?", ("3",), "a.jsonl:2"),
    ]
    dataset = build_prompt_dataset(records, tokenizer, apply_chat_template=False, max_prompt_length=16)
    assert list(dataset) == [
        PromptItem(ids_of(tokenizer, ["Compute", "1", "+", "2", "."]), "Compute 1 + 2.", ("3",), "a.jsonl:1"),
        PromptItem(ids_of(tokenizer, ["What", "is", "3", "?"]), "What is 3?", ("3",), "a.jsonl:2"),
    ]
    assert dataset.num_filtered == 0


def test_chat_template_wraps_a_string_prompt_with_a_single_bos() -> None:
    tokenizer = make_tokenizer()
    records = [MathRecord("Compute 1 + 2.", ("3",), "a.jsonl:1")]
    (item,) = build_prompt_dataset(records, tokenizer, apply_chat_template=True, max_prompt_length=16)
    assert item.prompt_text == "<s><|user|>Compute 1 + 2.<|assistant|>"
    expected = ["<s>", "<|user|>", "Compute", "1", "+", "2", ".", "<|assistant|>"]
    assert item.prompt_ids == ids_of(tokenizer, expected)


def test_chat_template_renders_message_lists() -> None:
    tokenizer = make_tokenizer()
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2?"})
    (item,) = build_prompt_dataset(
        [MathRecord(messages, ("2",), "b.json[0]")], tokenizer, apply_chat_template=True, max_prompt_length=16
    )
    assert item.prompt_text == "<s><|system|>Be brief.<|user|>What is 2?<|assistant|>"
    assert item.prompt_ids.count(tokenizer.bos_token_id) == 1


def test_message_list_without_chat_template_names_the_source() -> None:
    record = MathRecord(({"role": "user", "content": "What is 2?"},), ("2",), "b.json[4]")
    with pytest.raises(DatasetError, match=r"b\.json\[4\]: .*apply_chat_template"):
        build_prompt_dataset([record], make_tokenizer(), apply_chat_template=False, max_prompt_length=16)


def test_tokenizer_without_template_is_refused_when_one_is_asked_for() -> None:
    record = MathRecord("What is 2?", ("2",), "a.jsonl:1")
    with pytest.raises(ValueError, match="no chat_template"):
        build_prompt_dataset([record], make_tokenizer(None), apply_chat_template=True, max_prompt_length=16)


def test_long_prompts_are_dropped_and_counted_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    records = [
        MathRecord("What is 1?", ("1",), "a.jsonl:1"),  # 4 tokens
        MathRecord("Compute 1 + 2 + 3.", ("6",), "a.jsonl:2"),  # 7 tokens
        MathRecord("What is 2?", ("2",), "a.jsonl:3"),  # 4 tokens
        MathRecord("Compute 1 + 2 - 3.", ("0",), "a.jsonl:4"),  # 7 tokens
    ]
    with caplog.at_level(logging.WARNING, logger="rlinf.data.datasets"):
        dataset = build_prompt_dataset(
            records, make_tokenizer(), apply_chat_template=False, max_prompt_length=6
        )
    assert [item.source for item in dataset] == ["a.jsonl:1", "a.jsonl:3"]
    assert dataset.num_filtered == 2
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "dropped 2 of 4" in warning.getMessage() and "max_prompt_length=6" in warning.getMessage()


def test_a_prompt_exactly_at_the_limit_is_kept() -> None:
    record = MathRecord("What is 1?", ("1",), "a.jsonl:1")
    dataset = build_prompt_dataset([record], make_tokenizer(), apply_chat_template=False, max_prompt_length=4)
    assert len(dataset) == 1


def test_all_prompts_too_long_is_an_error() -> None:
    record = MathRecord("Compute 1 + 2 + 3.", ("6",), "a.jsonl:1")
    with pytest.raises(
        DatasetError,
        match=r"data: all 1 prompts are longer than data.max_prompt_length=3 tokens \(the shortest has 7\)",
    ):
        build_prompt_dataset([record], make_tokenizer(), apply_chat_template=False, max_prompt_length=3)


def test_prompt_dataset_is_a_sequence() -> None:
    items = [PromptItem((i,), str(i), ("1",), f"s:{i}") for i in range(3)]
    dataset = PromptDataset(items, num_filtered=1)
    assert len(dataset) == 3
    assert dataset[1] is items[1] and dataset[-1] is items[2]
    assert dataset[1:] == items[1:]
    assert items[2] in dataset


# PromptLoader: batches over a PromptDataset, resumable from a checkpoint.


def take(loader: PromptLoader[int], steps: int) -> list[list[int]]:
    return [loader.next_batch() for _ in range(steps)]


@pytest.mark.parametrize("shuffle", [True, False])
def test_resumed_loader_yields_what_the_uninterrupted_one_would(shuffle: bool) -> None:
    data = list(range(10))  # 3 batches of 3 per epoch, one item dropped
    uninterrupted = PromptLoader(data, 3, shuffle=shuffle, seed=7)
    expected = take(uninterrupted, 11)

    first_half = PromptLoader(data, 3, shuffle=shuffle, seed=7)
    before = take(first_half, 4)
    state = first_half.state_dict()
    assert state == {"epoch": 1, "index": 3, "seed": 7, "size": 10}
    resumed = PromptLoader(data, 3, shuffle=shuffle, seed=7)
    resumed.load_state_dict(state)
    assert before + take(resumed, 7) == expected


def test_epochs_are_reshuffled_but_each_covers_every_item() -> None:
    data = list(range(12))
    loader = PromptLoader(data, 4, shuffle=True, seed=0)
    assert loader.steps_per_epoch == 3
    epochs = []
    for completed in range(3):
        assert (loader.epoch, loader.index) == (completed, 0)
        epochs.append([item for batch in take(loader, 3) for item in batch])
    assert all(sorted(order) == data for order in epochs)
    assert len({tuple(order) for order in epochs}) == 3
    assert epochs[0] != data  # shuffled at all


def test_epoch_order_depends_only_on_seed_and_epoch() -> None:
    data = list(range(12))
    walked = PromptLoader(data, 4, shuffle=True, seed=3)
    take(walked, 6)
    jumped = PromptLoader(data, 4, shuffle=True, seed=3)
    jumped.load_state_dict({"epoch": 2, "index": 0, "seed": 3, "size": 12})
    assert take(jumped, 3) == take(walked, 3)
    other_seed = PromptLoader(data, 4, shuffle=True, seed=4)
    assert take(other_seed, 3) != take(PromptLoader(data, 4, shuffle=True, seed=3), 3)


def test_unshuffled_loader_keeps_order_and_can_keep_the_last_short_batch() -> None:
    loader = PromptLoader(list("abcde"), 2, shuffle=False, seed=0, drop_last=False)
    assert loader.steps_per_epoch == 3
    assert take(loader, 4) == [["a", "b"], ["c", "d"], ["e"], ["a", "b"]]
    assert (loader.epoch, loader.index) == (1, 2)


def test_batch_larger_than_dataset_is_refused() -> None:
    with pytest.raises(ValueError, match=r"batch_size 5 is larger than the dataset \(4 items\)"):
        PromptLoader([1, 2, 3, 4], 5, shuffle=True, seed=0)


def test_resuming_with_another_seed_or_dataset_is_refused() -> None:
    state = PromptLoader(list(range(8)), 2, shuffle=True, seed=1).state_dict()
    with pytest.raises(ValueError, match="data seed is 1 but this run's is 2"):
        PromptLoader(list(range(8)), 2, shuffle=True, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="taken with 8 items in the dataset but it now has 9"):
        PromptLoader(list(range(9)), 2, shuffle=True, seed=1).load_state_dict(state)
