"""Every schema field is honoured by a named backend whose code reads it (rlinf/config/honoured.py)."""

import ast
import dataclasses
import importlib.util
import json
import typing
from functools import cache
from pathlib import Path

import pytest

from rlinf.config import ConfigError, load_config
from rlinf.config.honoured import DATA_SETUP, HONOURED
from rlinf.config.schema import Config

HOW_TO_ADD = (
    'add `"{key}": (BACKEND.reads("rlinf.module.that.reads.it"),),` to HONOURED in rlinf/config/honoured.py '
    "(BACKEND: ANY, TORCH_ACTOR, MEGATRON_ACTOR, TORCH_ROLLOUT, SGLANG_ROLLOUT, COLOCATED_ON_GPU; a reader "
    'still being written takes pending="who"), then regenerate docs: '
    "python -m rlinf.config.reference > docs/configuration.md"
)


def schema_leaves(cls: type = Config, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    leaves = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        leaves += schema_leaves(hints[f.name], key) if dataclasses.is_dataclass(hints[f.name]) else [key]
    return leaves


@cache
def attribute_names(module: str) -> frozenset[str] | None:
    """Names accessed as `<expr>.<name>` anywhere in the module's code; None if there is no such module."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    tree = ast.parse(Path(spec.origin).read_text())
    return frozenset(node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute))


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_every_schema_field_has_an_entry():
    missing = [key for key in schema_leaves() if key not in HONOURED]
    assert not missing, "schema fields with no honoured-by entry:\n" + "\n".join(
        HOW_TO_ADD.format(key=key) for key in missing
    )


def test_every_entry_is_a_schema_field():
    stale = sorted(set(HONOURED) - set(schema_leaves()))
    assert not stale, f"rlinf/config/honoured.py HONOURED names fields the schema no longer has: {stale}"


def _reader_cases():
    for key, readers in HONOURED.items():
        for reader in readers:
            for module in reader.modules:
                marks = []
                if reader.pending:
                    marks.append(
                        pytest.mark.xfail(
                            strict=True,
                            reason=f"reader pending ({reader.pending}). If this XPASSes the reader has landed: "
                            f'delete pending=... from HONOURED["{key}"] in rlinf/config/honoured.py',
                        )
                    )
                yield pytest.param(key, reader.backend.name, module, id=f"{key}-{module}", marks=marks)


@pytest.mark.parametrize(("key", "backend", "module"), list(_reader_cases()))
def test_named_module_reads_the_field(key, backend, module):
    leaf = key.rsplit(".", 1)[-1]
    assert _module_exists(module), (
        f"{key}: rlinf/config/honoured.py says {backend} honours it in {module}, but there is no such module"
    )
    names = attribute_names(module)
    assert names is not None and leaf in names, (
        f"{key}: {module} never accesses `.{leaf}`, yet rlinf/config/honoured.py says {backend} honours it "
        f"there. Read it in {module}, or correct HONOURED['{key}']"
    )


def test_reader_check_detects_a_deleted_reader(tmp_path, monkeypatch):
    # The check parses source: a module with the access passes, the same module without it does not.
    (tmp_path / "reader_probe.py").write_text("def f(cfg):\n    return cfg.rollout.max_batch_size\n")
    (tmp_path / "reader_gone.py").write_text("def f(cfg):\n    return 256\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "max_batch_size" in attribute_names("reader_probe")
    assert "max_batch_size" not in attribute_names("reader_gone")


# One override per backend condition: a non-default value the chosen backends ignore is refused,
# naming the key and the backend that would honour it.
IGNORED_ON_TINY = [
    ("rollout.gpu_memory_utilization=0.8", "rollout.rollout_backend=sglang"),
    ("actor.offload_between_phases=true", "actor and rollout colocated on the same GPUs"),
    ("actor.model.tensor_model_parallel_size=2", "actor.training_backend=megatron"),
    ("actor.optim.use_precision_aware_optimizer=true", "actor.training_backend=megatron"),
    ("rollout.sglang.attention_backend=triton", "rollout.rollout_backend=sglang"),
    ("data.train_data_paths=[my.jsonl]", "data.type=math"),
    ("data.prompt_key=question", "data.type=math"),
    ("data.skip_invalid=true", "data.type=math"),
]


@pytest.mark.parametrize(("override", "honoured_by"), IGNORED_ON_TINY)
def test_key_ignored_by_the_chosen_backend_is_refused(override, honoured_by):
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as err:
        load_config("tiny-moe-grpo-cpu", [override])
    message = str(err.value)
    assert message.startswith(f"{key}: set to "), message
    assert "actor.training_backend=torch, rollout.rollout_backend=torch, data.type=synthetic" in message
    assert f"honoured only by: {honoured_by}" in message
    assert message.endswith(f"Remove the key, or choose {honoured_by}"), message


def test_torch_rollout_key_refused_on_sglang_and_default_values_pass():
    with pytest.raises(ConfigError, match=r"rollout.max_batch_size: set to 3.*rollout.rollout_backend=torch"):
        load_config("moonlight-16b-grpo-megatron", ["rollout.max_batch_size=3"])
    # The Moonlight recipe sets offload/gpu_memory_utilization/TP for backends that honour them.
    load_config("moonlight-16b-grpo-megatron")
    # Files are read, the generator's knobs are not.
    with pytest.raises(
        ConfigError, match=r"data.synthetic.num_train: set to 5, .* honoured only by: data.type=synthetic"
    ):
        load_config("moonlight-16b-grpo-megatron", ["data.synthetic.num_train=5"])
    # Setting a key to its default is not a promise the backend breaks.
    load_config("tiny-moe-grpo-cpu", ["rollout.gpu_memory_utilization=0.5", "rollout.max_batch_size=3"])


# The data type is a choice like a backend: a data.* key that the data built under one type does
# not depend on must not be marked as honoured under that type. For every key the data setup reads,
# and each type under which HONOURED says it is honoured, changing the key changes the datasets (or
# refuses them). A new data key marked ANY but read only for one type fails here.
DATA_TYPES = {
    "synthetic": ["data.type=synthetic", "data.synthetic.num_train=40", "data.synthetic.num_val=8"],
    # One bad record (skipped) so that data.skip_invalid has something to decide.
    "math": ["data.type=math", "runner.val_check_interval=0", "data.skip_invalid=true"],
}


def _data_setup_keys() -> list[str]:
    return [
        key
        for key, readers in HONOURED.items()
        if key.startswith("data.") and key != "data.type" and any(DATA_SETUP in r.modules for r in readers)
    ]


def _math_files(tmp_path) -> list[str]:
    rows = [{"prompt": f"{a}+{b}=", "solutions": [str(a + b)]} for a in range(1, 10) for b in range(1, 5)]
    for name, part in (("a.jsonl", rows[:24]), ("b.jsonl", rows[24:])):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in part) + '{"prompt": "1+1="}\n')
    return [
        f"data.train_data_paths=[{tmp_path / 'a.jsonl'}]",
        f"data.val_data_paths=[{tmp_path / 'b.jsonl'}]",
    ]


def _variants(value) -> list:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, max(1, value // 2), 1]
    if isinstance(value, float):
        return [value * 2]
    if isinstance(value, str):
        return [value + "_other"]
    if isinstance(value, tuple):
        return [value + value, value[:1]] if value else [("other.jsonl",)]
    return []


def _override(key: str, value) -> str:
    if isinstance(value, tuple):
        return f"{key}=[{','.join(json.dumps(v) if v in '+-*' else str(v) for v in value)}]"
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


def _datasets(cfg, tokenizer):
    from rlinf.data.records import DatasetError
    from rlinf.runners.data_setup import build_datasets

    try:
        train, val, counters = build_datasets(cfg, tokenizer)
    except DatasetError as err:
        return f"refused: {err}"
    return list(train), list(val or ()), counters


def _honoured_cases():
    for key in _data_setup_keys():
        for data_type in DATA_TYPES:
            yield pytest.param(key, data_type, id=f"{key}-{data_type}")


@pytest.mark.parametrize(("key", "data_type"), list(_honoured_cases()))
def test_a_data_key_honoured_under_a_type_changes_its_data(key, data_type, tmp_path):
    from rlinf.models.tiny_tokenizer import build_char_tokenizer

    base = [*DATA_TYPES[data_type], *(_math_files(tmp_path) if data_type == "math" else [])]
    cfg = load_config("tiny-moe-grpo-cpu", base)
    honoured = any(r.backend.active(cfg) for r in HONOURED[key])
    value = _value_at(cfg, key)
    variants = [v for v in _variants(value) if v != value]
    if not honoured:
        # Refused up front (check_honoured), so it cannot silently do nothing.
        with pytest.raises(ConfigError, match=f"{key}: set to .* honoured only by"):
            load_config("tiny-moe-grpo-cpu", [*base, _override(key, variants[0])])
        return
    tokenizer = build_char_tokenizer("0123456789+-*=? abcdefghijklmnopqrstuvwxyz.")
    before = _datasets(cfg, tokenizer)
    changed = []
    for variant in variants:
        try:
            other = load_config("tiny-moe-grpo-cpu", [*base, _override(key, variant)])
        except ConfigError:
            changed.append(variant)  # refused: the key is checked, so it is read
            continue
        if _datasets(other, tokenizer) != before:
            changed.append(variant)
    assert changed, (
        f"{key}: HONOURED says it is honoured with data.type={data_type}, but none of {variants} changes "
        f"the data built from the recipe; mark it honoured only by the data type(s) that read it"
    )


def _value_at(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
