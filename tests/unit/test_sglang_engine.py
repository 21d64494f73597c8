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


class CrashOnResumeEngine(HangingEngine):
    """resume_memory_occupation runs the loop itself, as sglang.Engine's does, and its scheduler
    dies on the way (seen on the H200: torch_memory_saver's cuMemCreate out of memory)."""

    def resume_memory_occupation(self, tags=None):
        async def reply_never_comes():
            self.loop.call_later(0.2, signal.raise_signal, signal.SIGQUIT)
            await asyncio.sleep(3600)

        return self.loop.run_until_complete(reply_never_comes())

    def release_memory_occupation(self, tags=None):
        return None


class ReplyingEngine:
    """Replies arrive only through the tokenizer manager's response task, which, as in sglang
    0.5.12, lands on the *running* loop or, outside one, on a new loop it creates."""

    def __init__(self, **kwargs):
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.replies: asyncio.Queue | None = None
        engine = self

        class TokenizerManager:
            event_loop = None

            def auto_create_handle_loop(self):
                if self.event_loop is not None:
                    return
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    loop = asyncio.new_event_loop()
                    asyncio.set_event_loop(loop)
                engine.replies = asyncio.Queue()
                loop.create_task(engine.replies.put({"output_ids": [7]}))
                self.event_loop = loop

        self.tokenizer_manager = TokenizerManager()

    async def async_generate(self, **kwargs):
        self.tokenizer_manager.auto_create_handle_loop()
        return [await self.replies.get()]


def hung(signum, frame):
    raise TimeoutError("generate waited 5 s for a reply that never came")


def test_generate_gets_the_reply_of_the_engines_own_loop(monkeypatch):
    """Seen on the H200: the response task started outside the engine's loop never ran."""
    monkeypatch.setattr(se, "import_sglang", lambda: ReplyingEngine)
    engine = se.SGLangEngine({}, where="rollout engine (rank 0 of 1, GPUs [0])")
    try:
        assert engine.engine.tokenizer_manager.event_loop is engine.engine.loop
        signal.signal(signal.SIGALRM, hung)
        signal.alarm(5)
        assert engine.generate([[1, 2]], [{}]) == [{"output_ids": [7]}]
    finally:
        signal.alarm(0)
        engine.engine.loop.remove_signal_handler(signal.SIGQUIT)
        engine.engine.loop.close()


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


def test_child_crash_during_a_memory_call_ends_it_with_the_engine_log(monkeypatch):
    monkeypatch.setattr(se, "import_sglang", lambda: CrashOnResumeEngine)
    monkeypatch.setattr(
        se, "stderr_tail", lambda: "[torch_memory_saver.cpp] cudaError error: 2 (out of memory)"
    )
    engine = se.SGLangEngine({"enable_memory_saver": True}, where="rollout engine (rank 0 of 1, GPUs [0])")
    try:
        engine.release(["weights"])
        signal.signal(signal.SIGALRM, hung)
        signal.alarm(5)
        with pytest.raises(se.EngineDiedError, match=r"(?s)rank 0 of 1.*died\n.*out of memory"):
            engine.resume(["weights"])
    finally:
        signal.alarm(0)
        engine.engine.loop.remove_signal_handler(signal.SIGQUIT)
        engine.engine.loop.close()
