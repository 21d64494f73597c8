"""What a worker runs with, said once at start-up: one printed line, and a JSON file next to the
run's resolved config (the logs folder) when the run has one."""

from __future__ import annotations

import json
import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def announce(title: str, record: dict[str, Any], log_dir: str | None, filename: str) -> dict[str, Any]:
    """Prints `title: key=value, ...` (call once, on one rank) and writes `record` to
    `log_dir`/`filename` when `log_dir` is given."""
    line = f"{title} " + ", ".join(f"{k}={v}" for k, v in record.items())
    print(line, flush=True)
    logger.info(line)
    if log_dir is not None:
        out = Path(log_dir).resolve() / filename
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def package_version(distribution: str) -> str:
    """The installed version of a package a record names; "unknown" without its metadata."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"
