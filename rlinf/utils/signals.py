"""SIGINT/SIGTERM -> finish the current phase, checkpoint, exit 0 (instead of dying mid-step)."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class StopRequest:
    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""

    def _handle(self, signum, _frame) -> None:
        if self.requested:  # a second Ctrl-C means "now"
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        print(f"\n{self.signal_name} received: finishing this step, then saving a checkpoint", flush=True)

    @contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
