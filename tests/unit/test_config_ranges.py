"""Every numeric recipe key has a range (rlinf/config/ranges.py) and NaN / inf never pass the check."""

import math
import typing

import pytest

from rlinf.config import ConfigError, load_config
from rlinf.config.ranges import RANGES, numeric_leaves
from rlinf.config.schema import Config

TINY = "tiny-moe-grpo-cpu"


def _value_at(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_every_numeric_schema_key_has_a_range():
    missing = [key for key in numeric_leaves() if key not in RANGES]
    assert not missing, (
        f"numeric schema keys without a range: {missing}; add them to RANGES in rlinf/config/ranges.py"
    )
    assert not set(RANGES) - set(numeric_leaves()), "RANGES names keys the schema no longer has"


def test_every_default_is_in_its_range():
    default = Config()
    for key, bound in RANGES.items():
        value = _value_at(default, key)
        assert value is None or bound.holds(value), f"{key}: default {value} outside {bound.describe()}"


FLOAT_KEYS = [key for key in numeric_leaves() if isinstance(_value_at(Config(), key), float)]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_a_non_finite_float_is_refused_for_every_key(key, bad):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, [f"{key}={bad}"])
    assert str(err.value) == f"{key}: {float(bad)} is not a finite number"


def _is_int_key(key: str) -> bool:
    cls: type = Config
    *sections, leaf = key.split(".")
    for section in sections:
        cls = typing.get_type_hints(cls)[section]
    tp = typing.get_type_hints(cls)[leaf]
    return float not in (typing.get_args(tp) or (tp,))


BOUNDED_BELOW = sorted(key for key, bound in RANGES.items() if not math.isinf(bound.low))


@pytest.mark.parametrize("key", BOUNDED_BELOW)
def test_a_value_below_the_range_is_refused(key):
    bound = RANGES[key]
    below = bound.low if bound.low_open else bound.low - 1
    value = int(below) if _is_int_key(key) else float(below)
    with pytest.raises(ConfigError) as err:
        load_config(TINY, [f"{key}={value}"])
    assert str(err.value).startswith(f"{key}: {value} is out of range; it must be "), str(err.value)


def test_range_messages():
    assert RANGES["rollout.gpu_memory_utilization"].describe() == "in (0, 1]"
    assert RANGES["actor.optim.adam_beta2"].describe() == "in [0, 1)"
    assert RANGES["runner.max_steps"].describe() == "-1 or >= 1 (-1 = bounded by runner.max_epochs only)"
    with pytest.raises(
        ConfigError, match=r"actor.optim.adam_beta1: 1.0 is out of range; it must be in \[0, 1\)"
    ):
        load_config(TINY, ["actor.optim.adam_beta1=1.0"])
    load_config(
        TINY,
        ["algorithm.early_stop_imp_ratio=-1.0", "runner.max_steps=-1", "actor.lr_sched.lr_decay_steps=200"],
    )
