"""Signals. In the training loop SIGINT/SIGTERM finish the current step, checkpoint, exit 0 (instead
of dying mid-step). Outside it, from the process's start, SIGTERM unwinds the run like Ctrl-C:
workers, Ray and the output folders' locks are released on the way out, and the run says so."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class Stopped(KeyboardInterrupt):
    """SIGTERM where no step can be finished and saved (start-up, the final save, shutdown).

    A KeyboardInterrupt, so that no `except Exception` swallows it, and because Ray's blocking
    calls (ray.get, ray.wait) handle only KeyboardInterrupt from a signal handler: they raise a
    plain one in its place (see `stopped_by`) and turn any other exception into an internal error."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


_received: list[int] = []  # the SIGTERMs Stopped was raised for


def _raise_stopped(signum, _frame) -> None:
    _received.append(signum)
    raise Stopped(signum)


def stopped_by(err: BaseException) -> Stopped | None:
    """The Stopped that `err` stands for: itself, or the plain KeyboardInterrupt a Ray call raised in
    its place; None for a real Ctrl-C."""
    if isinstance(err, Stopped):
        return err
    if isinstance(err, KeyboardInterrupt) and _received:
        return Stopped(_received[-1])
    return None


def stop_on_sigterm() -> None:
    """Make SIGTERM raise Stopped in the main thread. Call it first thing, and again after anything
    that installs its own handler (Ray's driver installs one that dumps a stack and exits)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_stopped)


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
