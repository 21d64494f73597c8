"""EOS ids come from the checkpoint's generation_config.json and the tokenizer (the SGLang rollout
reads the file itself; the torch rollout uses its model's generation config)."""

import json
from types import SimpleNamespace

import pytest
from transformers import GenerationConfig

from rlinf.workers.common import eos_token_ids
from rlinf.workers.rollout.sglang_rollout import _generation_config


def test_the_generation_config_and_the_tokenizer_both_count(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    config = _generation_config(str(tmp_path))
    assert isinstance(config, GenerationConfig)
    assert eos_token_ids(config, SimpleNamespace(eos_token_id=9)) == [5, 7, 9]


def test_without_a_generation_config_the_tokenizer_decides(tmp_path):
    assert _generation_config(str(tmp_path)) is None
    assert eos_token_ids(None, SimpleNamespace(eos_token_id=3)) == [3]
    with pytest.raises(ValueError, match="defines no eos_token_id"):
        eos_token_ids(None, SimpleNamespace(eos_token_id=None))
