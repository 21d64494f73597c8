"""SIGTERM outside the training loop unwinds the run as Stopped, also through Ray's blocking calls."""

import os
import signal
import time

import pytest

from rlinf.utils import signals
from rlinf.utils.signals import Stopped, stop_on_sigterm, stopped_by


@pytest.fixture
def sigterm_handler(monkeypatch):
    monkeypatch.setattr(signals, "_received", [])
    previous = signal.getsignal(signal.SIGTERM)
    stop_on_sigterm()
    yield
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_raises_stopped_which_no_except_exception_swallows(sigterm_handler):
    with pytest.raises(Stopped) as err:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here
        except Exception:  # noqa: BLE001 - the point: this must not catch it
            pytest.fail("an `except Exception` caught the stop")
    assert err.value.signum == signal.SIGTERM and str(err.value) == "stopped by SIGTERM"


def test_a_plain_keyboard_interrupt_stands_for_the_sigterm_ray_swallowed(sigterm_handler):
    assert stopped_by(KeyboardInterrupt()) is None  # a real Ctrl-C stays one
    with pytest.raises(Stopped):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    # ray.get / ray.wait turn the handler's exception into a KeyboardInterrupt of their own
    stop = stopped_by(KeyboardInterrupt())
    assert stop is not None and stop.signal_name == "SIGTERM"
