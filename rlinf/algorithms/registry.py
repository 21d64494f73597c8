"""Name -> implementation tables, keyed by the names a recipe uses (e.g. `algorithm.adv_type`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

Entry = TypeVar("Entry")


class Registry(Generic[Entry]):
    """A table of implementations filled by a `register` decorator at import time."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # names the table in error messages, e.g. "advantage estimator"
        self._entries: dict[str, Entry] = {}

    def register(self, name: str) -> Callable[[Entry], Entry]:
        def add(entry: Entry) -> Entry:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> Entry:
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}")
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._entries
