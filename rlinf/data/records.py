"""Reading math datasets (.jsonl / .json / .parquet) into typed `MathRecord`s.

The default shape is AReaL-boba's: `{"prompt": "<text>", "solutions": ["<answer>", ...]}`. The
prompt may instead be a list of chat messages (`{"role", "content"}`), and the answer field may be a
single string or number. Every bad record is reported with its file and line (jsonl, 1-based) or
index (json / parquet, 0-based), so a broken line in a 100k-line file can be found at once.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ChatMessage = dict[str, str]
Prompt = str | tuple[ChatMessage, ...]

# How many skip reasons the summary warning quotes; the full list is in LoadedRecords.skipped.
_REASONS_IN_WARNING = 5


class DatasetError(ValueError):
    """A data file or one of its records cannot be used; the message names where and why."""


@dataclass(frozen=True)
class MathRecord:
    prompt: Prompt  # plain (possibly already templated) text, or chat messages {role, content}
    solutions: tuple[str, ...]  # accepted reference answers, at least one
    source: str  # "path:line" for jsonl, "path[index]" for json and parquet


@dataclass
class LoadedRecords:
    records: list[MathRecord]
    num_skipped: int = 0
    skipped: list[str] = field(default_factory=list)  # "<source>: <reason>" per skipped record


@dataclass(frozen=True)
class _Unparseable:
    """Stands in for a jsonl line that is not valid JSON, so it is reported like any bad record."""

    reason: str


class _BadRecord(Exception):
    """Raised by the field checks; carries the reason without the source, which the caller adds."""


def load_math_records(
    paths: Sequence[str],
    *,
    prompt_key: str = "prompt",
    answer_key: str = "solutions",
    skip_invalid: bool = False,
) -> LoadedRecords:
    """Read every file in `paths` (in order) into records.

    A bad record raises `DatasetError`, or with `skip_invalid` is skipped, counted and summarised in
    one warning. Problems with a whole file (missing, unknown extension, unreadable) always raise.
    """
    if not paths:
        raise DatasetError("no data files given")
    loaded = LoadedRecords(records=[])
    for path in paths:
        for source, raw in _read_raw_records(Path(path)):
            try:
                loaded.records.append(_to_record(raw, source, prompt_key, answer_key))
            except _BadRecord as bad:
                message = f"{source}: {bad}"
                if not skip_invalid:
                    raise DatasetError(message) from None
                loaded.skipped.append(message)
    loaded.num_skipped = len(loaded.skipped)
    if loaded.skipped:
        logger.warning(
            "skipped %d invalid record(s) in %s; first: %s",
            loaded.num_skipped,
            ", ".join(paths),
            "; ".join(loaded.skipped[:_REASONS_IN_WARNING]),
        )
    if not loaded.records:
        raise DatasetError(f"no usable records in {', '.join(paths)} ({loaded.num_skipped} skipped)")
    return loaded


def _read_raw_records(path: Path) -> Iterator[tuple[str, Any]]:
    if path.is_dir():
        raise DatasetError(
            f"{path}: is a directory, not a data file (list the .jsonl, .json or .parquet files in it)"
        )
    if not path.is_file():
        raise DatasetError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        return _read_json(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise DatasetError(f"{path}: unknown data file extension {suffix!r} (expected .jsonl, .json or .parquet)")


def _read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    # Decoded line by line, so one line that is not UTF-8 is a bad record like any other.
    with _open_binary(path) as lines:
        for line_number, raw_line in enumerate(lines, start=1):
            source = f"{path}:{line_number}"
            try:
                # utf-8-sig: editors on Windows put a byte-order mark before the first line.
                line = raw_line.decode("utf-8-sig" if line_number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                yield source, _Unparseable(_not_utf8(err))
                continue
            if not line.strip():
                continue
            try:
                yield source, json.loads(line)
            except json.JSONDecodeError as err:
                yield source, _Unparseable(f"invalid JSON: {err.msg} (column {err.colno})")


def _open_binary(path: Path):
    try:
        return path.open("rb")
    except OSError as err:
        raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from None


def _not_utf8(err: UnicodeDecodeError, offset: int = 0) -> str:
    """Names the first byte that is not UTF-8 and its (1-based) byte column."""
    byte = err.object[err.start]
    return f"not UTF-8 text: byte 0x{byte:02x} at column {err.start - offset + 1}; save the file as UTF-8"


def _read_json(path: Path) -> Iterator[tuple[str, Any]]:
    with _open_binary(path) as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        line = data.count(b"\n", 0, err.start) + 1
        # One JSON document: no record can be skipped around the bad byte.
        raise DatasetError(f"{path}:{line}: {_not_utf8(err, offset=line_start)}") from None
    try:
        content = json.loads(text)
    except json.JSONDecodeError as err:
        raise DatasetError(
            f"{path}: invalid JSON: {err.msg} (line {err.lineno}, column {err.colno})"
        ) from None
    if not isinstance(content, list):
        raise DatasetError(f"{path}: expected a JSON list of records, got {_json_type(content)}")
    for index, item in enumerate(content):
        yield f"{path}[{index}]", item


def _read_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq  # pyarrow is only needed by parquet users

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises several unrelated types for a corrupt file
        raise DatasetError(f"{path}: cannot read parquet file: {err}") from err
    for index, row in enumerate(rows):
        yield f"{path}[{index}]", row


def _to_record(raw: Any, source: str, prompt_key: str, answer_key: str) -> MathRecord:
    if isinstance(raw, _Unparseable):
        raise _BadRecord(raw.reason)
    if not isinstance(raw, dict):
        raise _BadRecord(f"expected a JSON object, got {_json_type(raw)}")
    for key in (prompt_key, answer_key):
        if key not in raw:
            raise _BadRecord(f"missing key {key!r} (keys present: {', '.join(map(str, raw)) or 'none'})")
    return MathRecord(
        prompt=_parse_prompt(raw[prompt_key], prompt_key),
        solutions=_parse_solutions(raw[answer_key], answer_key),
        source=source,
    )


def _parse_prompt(value: Any, key: str) -> Prompt:
    if isinstance(value, str):
        if not value.strip():
            raise _BadRecord(f"{key!r} is an empty string")
        return value
    if isinstance(value, list):
        messages = tuple(_parse_message(item, key, i) for i, item in enumerate(value))
        if not any(message["content"].strip() for message in messages):
            raise _BadRecord(f"{key!r} has no message with content")
        return messages
    raise _BadRecord(f"{key!r} must be a string or a list of chat messages, got {_json_type(value)}")


def _parse_message(item: Any, key: str, index: int) -> ChatMessage:
    where = f"{key!r} message {index}"
    if not isinstance(item, dict):
        raise _BadRecord(f"{where} must be an object with 'role' and 'content', got {_json_type(item)}")
    role, content = item.get("role"), item.get("content")
    if not isinstance(role, str) or not role:
        raise _BadRecord(f"{where} needs a non-empty string 'role'")
    if not isinstance(content, str):
        raise _BadRecord(f"{where} needs a string 'content'")
    # Only role and content are kept: they are all a chat template is given.
    return {"role": role, "content": content}


def _parse_solutions(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, list):
        if not value:
            raise _BadRecord(f"{key!r} is an empty list")
        return tuple(_parse_answer(item, f"{key!r}[{i}]") for i, item in enumerate(value))
    return (_parse_answer(value, repr(key)),)


def _parse_answer(value: Any, where: str) -> str:
    # bool is an int subclass, but `true` as an answer is a data bug, not the number 1.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise _BadRecord(f"{where} is not a finite number: {value}")
        return str(value)
    if not isinstance(value, str):
        raise _BadRecord(f"{where} must be a string or a number, got {_json_type(value)}")
    if not value.strip():
        raise _BadRecord(f"{where} is an empty string")
    return value


def _json_type(value: Any) -> str:
    """The JSON name of a value's type: users write JSON, not Python."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
