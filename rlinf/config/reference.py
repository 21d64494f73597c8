"""Render docs/configuration.md from the schema's `# doc:` comments (a test keeps them in step).

Regenerate with: python -m rlinf.config.reference > docs/configuration.md
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing

from rlinf.config import schema
from rlinf.config.honoured import HONOURED, honoured_by
from rlinf.config.typed import to_dict

FIELD_LINE = re.compile(r"^\s+(\w+):\s*(.+?)\s*=\s*(.+?)\s*# doc: (.+)$")
PRECEDING_DOC = re.compile(r"^\s+# doc: (.+)$")


def _field_docs(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    pending = None
    for line in inspect.getsource(cls).splitlines():
        if m := PRECEDING_DOC.match(line):
            pending = m.group(1)
            continue
        if m := FIELD_LINE.match(line):
            docs[m.group(1)] = m.group(4)
        elif pending and (name := re.match(r"^\s+(\w+):", line)):
            docs[name.group(1)] = pending
        pending = None
    return docs


def _honoured(key: str) -> str:
    if key not in HONOURED:
        return "**no entry in rlinf/config/honoured.py**"
    return honoured_by(key).replace("every backend", "all").replace("|", "\\|")


def _rows(cls: type, prefix: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    default = cls()
    rows = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(default, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            rows.extend(_rows(hints[f.name], key))
            continue
        shown = to_dict(value)
        type_name = (
            str(hints[f.name])
            .replace("typing.", "")
            .replace("<class '", "")
            .replace("'>", "")
            .replace("|", "\\|")
        )
        rows.append(f"| `{key}` | `{type_name}` | `{shown!r}` | {docs.get(f.name, '')} | {_honoured(key)} |")
    return rows


def render_reference() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `rlinf/config/schema.py` by `python -m rlinf.config.reference`; a unit test",
        "fails when this page and the schema disagree. Every key is typed: an unknown key or a wrong",
        "type stops the run before any worker starts, naming the key (and the closest valid one).",
        "",
        "The last column says which backend honours a key (`rlinf/config/honoured.py`). A recipe that sets",
        "a key to a non-default value while running a backend that ignores it is refused, naming the key",
        "and the backend that would honour it.",
        "",
    ]
    for f in dataclasses.fields(schema.Config):
        section_cls = typing.get_type_hints(schema.Config)[f.name]
        lines += [
            f"## `{f.name}`",
            "",
            "| key | type | default | meaning | honoured by |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += _rows(section_cls, f.name)
        lines.append("")
    lines += _exit_code_rows()
    return "\n".join(lines)


def _exit_code_rows() -> list[str]:
    from rlinf.config.exit_codes import TABLE

    return [
        "## Exit codes",
        "",
        "`examples/reasoning/main_grpo.py` ends bad input with one line naming the key or file and the",
        "problem, checked before anything is written and before Ray starts, and an exit code per class",
        "(`rlinf/config/exit_codes.py`):",
        "",
        "| code | meaning |",
        "| --- | --- |",
        *(f"| {code} | {meaning} |" for code, _, meaning in TABLE),
        "",
        "Text a tokenizer cannot represent is not an error: it becomes the unknown token, and one warning",
        "per split says how many prompt tokens that hit, with examples. The tiny model's character",
        "tokenizer knows only the characters of its arithmetic task, so most prose (GSM8K, AReaL-boba)",
        "is largely unknown to it: such data runs, but the tiny model cannot read it.",
        "",
    ]


if __name__ == "__main__":
    print(render_reference(), end="")
