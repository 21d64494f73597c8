"""Plain nested dicts -> frozen typed dataclasses, checking every key and type on the way.

Errors name the dotted key, what was expected and, for an unknown key, the closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

T = TypeVar("T")


class ConfigError(ValueError):
    """A recipe that cannot run; the message names the key and the fix."""


def closest_key(key: str, valid: list[str]) -> str | None:
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return match[0] if match else None


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass `cls` from `data` (a mapping), recursively, validating every field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__} ({data!r})")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in data:
        if key not in names:
            dotted = f"{where}.{key}" if where else str(key)
            hint = closest_key(str(key), names)
            suggestion = f"; did you mean '{where + '.' if where else ''}{hint}'?" if hint else ""
            raise ConfigError(f"unknown key '{dotted}'{suggestion} (valid keys here: {', '.join(names)})")
    kwargs = {name: _convert(hints[name], data[name], f"{where}.{name}" if where else name) for name in data}
    return cls(**kwargs)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)  # type: ignore[arg-type]
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise ConfigError(f"{where}: null is not allowed (expected {_type_name(tp)})")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(
            errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of {_type_name(tp)}"
        )
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            hint = closest_key(str(value), [str(a) for a in allowed])
            extra = f"; did you mean '{hint}'?" if hint else ""
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, allowed))}{extra}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} ({value!r})")
        (item_type, _ellipsis) = get_args(tp)
        return tuple(_convert(item_type, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} ({value!r})")
        key_type, value_type = get_args(tp)
        return {
            _convert(key_type, k, f"{where}.{k}"): _convert(value_type, v, f"{where}.{k}")
            for k, v in value.items()
        }
    return _convert_scalar(tp, value, where)


def _convert_scalar(tp: Any, value: Any, where: str) -> Any:
    # bool is a subclass of int: reject True where a number is expected and 1 where a bool is.
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise ConfigError(f"{where}: unsupported schema type {tp!r}")
    raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} ({value!r})")


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> plain dict/list tree (tuples become lists) for YAML dumps."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
