"""One writer per output folder: a run holds a lock file in each folder it writes, from before Ray
starts until it exits.

The lock is an advisory `flock` on `<folder>/.rlinf_run.lock`, whose text names the holder (PID,
host, start time, command). The kernel drops the lock when its process ends however it ends
(SIGKILL, OOM, a crash), so a folder whose lock file remains but whose lock is free belongs to a
run that is gone: the next run takes it over with a warning. A clean exit removes the file.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)

LOCK_FILE = ".rlinf_run.lock"


class FolderInUseError(RuntimeError):
    """Another live run holds the folder's lock; the message names the folder and the holder."""


class FolderLock:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises FolderInUseError if a live run holds the folder, OSError if the folder cannot be
        written (the lock file is the first thing written there)."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(_read(fd))
                os.close(fd)
                raise FolderInUseError(f"{self.folder} is in use by another run ({holder})") from None
            except OSError as err:  # a filesystem without locks: run, but say what is not enforced
                logger.warning(
                    "%s: cannot lock (%s); one writer per folder is not enforced here", self.folder, err
                )
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the holder removed the file between our open and our lock: open the new one
        previous = _read(fd)
        if previous:
            logger.warning(
                "%s: taking over the lock of a run that is gone without releasing it (%s)",
                self.folder,
                _describe(previous),
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        # Unlink before unlocking: a run that opened the old file then sees it is gone and retries.
        if _same_file(self._fd, self.path):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None


def _holder() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv),
    }


def _read(fd: int) -> dict:
    text = os.pread(fd, 65536, 0).decode(errors="replace").strip()
    if not text:
        return {}
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {"unreadable": text[:80]}
    return holder if isinstance(holder, dict) else {"unreadable": text[:80]}


def _describe(holder: dict) -> str:
    if not holder:
        return "holder unknown"
    if "pid" not in holder:
        return f"unreadable lock file: {holder.get('unreadable', '')!r}"
    return f"PID {holder['pid']} on host {holder.get('host', '?')}, started {holder.get('started', '?')}"


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
