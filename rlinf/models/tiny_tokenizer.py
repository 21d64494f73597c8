"""A character-level tokenizer and chat template for the tiny model's arithmetic task.

One token per character keeps the vocabulary at a few dozen entries (a tiny embedding table) and
makes every digit its own token, which is what lets a ~1M-parameter model learn column arithmetic.
It is saved as a plain `tokenizer.json` that `AutoTokenizer.from_pretrained` loads without
remote code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|im_end|>"
USER_TOKEN = "<|user|>"
ASSISTANT_TOKEN = "<|assistant|>"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, EOS_TOKEN, USER_TOKEN, ASSISTANT_TOKEN)

# BOS is written by the template, not added by the tokenizer: prompt rendering tokenizes the
# templated text with add_special_tokens=False (rlinf.data.datasets), so it must be in the text.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "<|user|>{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "<|assistant|>{{ message['content'] }}{{ eos_token }}"
    "{%- else -%}"
    "{{ raise_exception('the tiny chat template knows only user and assistant messages, not ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def build_char_tokenizer(charset: str) -> PreTrainedTokenizerFast:
    """Special tokens first (ids 0..5), then one token per distinct character of `charset`.

    Characters outside the charset become <|unk|> instead of silently vanishing.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    characters = list(dict.fromkeys(charset))
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *characters])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[USER_TOKEN, ASSISTANT_TOKEN],
        padding_side="left",  # prompts are left-padded for batched generation (RolloutBatch)
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
