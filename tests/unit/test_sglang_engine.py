"""SGLangEngine's failure reporting with a fake sglang.Engine: a start failure and a child crash
both name the engine and carry SGLang's message / the log tail (the real engine: tests/gpu)."""

import asyncio
import signal

import pytest

import rlinf.workers.rollout.sglang_engine as se


class FailingEngine:
    def __init__(self, **kwargs):
        raise RuntimeError("Rank 0 scheduler died during initialization (exit code: -9)")


class HangingEngine:
    """generate never finishes: only a child crash (SIGQUIT) can end it."""

    def __init__(self, **kwargs):
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.tokenizer_manager = type("TM", (), {"auto_create_handle_loop": lambda self: None})()

    async def async_generate(self, **kwargs):
        self.loop.call_later(0.2, signal.raise_signal, signal.SIGQUIT)  # a scheduler crashes
        await asyncio.sleep(3600)


def test_start_failure_names_the_engine_and_keeps_sglangs_message(monkeypatch):
    monkeypatch.setattr(se, "import_sglang", lambda: FailingEngine)
    monkeypatch.setattr(
        se, "stderr_tail", lambda: "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory"
    )
    with pytest.raises(se.EngineStartError) as err:
        se.SGLangEngine({}, where="rollout engine (rank 1 of 2, GPUs [4, 5, 6, 7])")
    text = str(err.value)
    assert text.startswith(
        "rollout engine (rank 1 of 2, GPUs [4, 5, 6, 7]): SGLang engine failed to start: Rank 0"
    )
    assert text.endswith("torch.OutOfMemoryError: CUDA out of memory")


def test_child_crash_ends_the_pending_call_with_the_engine_log(monkeypatch):
    monkeypatch.setattr(se, "import_sglang", lambda: HangingEngine)
    monkeypatch.setattr(se, "stderr_tail", lambda: "scheduler: CUDA error: an illegal memory access")
    engine = se.SGLangEngine({}, where="rollout engine (rank 0 of 1, GPUs [0])")
    try:
        with pytest.raises(se.EngineDiedError, match=r"(?s)rank 0 of 1.*died\n.*illegal memory access"):
            engine.generate([[1, 2]], [{}])
        with pytest.raises(se.EngineDiedError):  # and every later call, at once
            engine.flush_cache()
    finally:
        engine.engine.loop.remove_signal_handler(signal.SIGQUIT)
        engine.engine.loop.close()
