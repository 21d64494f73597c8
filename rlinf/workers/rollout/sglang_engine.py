"""One SGLang offline Engine (sglang 0.5.12) with rlinf's error handling and memory bookkeeping.

`SGLangRollout` (the Ray worker) owns one of these; GPU tests drive it directly. Every SGLang call
rlinf makes goes through this class, so tests/gpu/test_sglang_signatures.py checks exactly these
against the installed package (`SGLANG_CALLS`).

Failures: SGLang's child processes (schedulers, detokenizer) report a crash by SIGQUIT to this
process, whose default handler kills the whole process tree, the Ray worker included, so only
"actor died" would reach the driver. We record the SIGQUIT instead, stop the pending call, and raise
`EngineDiedError` with the children's exit codes and the tail of the log they wrote (this process's
stderr, which they inherit), so the engine's own traceback reaches the runner's failure message.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlinf.workers.backends import INSTALL_HINT as GPU_STACK_HINT
from rlinf.workers.rollout.group_quota import GroupQuota, run_until_quota
from rlinf.workers.rollout.sglang_args import ALL_MEMORY_TAGS
from rlinf.workers.rollout.sglang_hooks import enable_for_children as enable_rlinf_hooks

INSTALL_HINT = f"rollout.rollout_backend=sglang needs sglang 0.5.12 (Python 3.12, CUDA); {GPU_STACK_HINT}"
# (object, method) pairs of sglang.Engine this module calls, with the keyword arguments it passes.
SGLANG_CALLS: dict[str, tuple[str, ...]] = {
    "async_generate": ("input_ids", "sampling_params", "return_logprob", "return_routed_experts", "rid"),
    "update_weights_from_tensor": ("named_tensors", "load_format", "flush_cache"),
    "init_weights_update_group": (
        "master_address",
        "master_port",
        "rank_offset",
        "world_size",
        "group_name",
        "backend",
    ),
    "update_weights_from_distributed": ("names", "dtypes", "shapes", "group_name", "flush_cache"),
    "flush_cache": (),
    "release_memory_occupation": ("tags",),
    "resume_memory_occupation": ("tags",),
    "shutdown": (),
}
LOG_TAIL_LINES = 25

_sigquit_seen: list[int] = []


class EngineStartError(RuntimeError):
    """The engine did not come up; the message carries SGLang's own error and the log tail."""


class EngineDiedError(RuntimeError):
    """An engine process died while serving; the message carries its exit codes and log tail."""


class EngineCallError(RuntimeError):
    """SGLang answered a weight or memory call with success=False."""


def record_sigquit(signum, frame) -> None:
    """Launch-phase SIGQUIT handler (a module function: ServerArgs travels to the children by
    pickle). Records instead of killing the process tree; Engine() then raises on its own."""
    _sigquit_seen.append(signum)


def import_sglang():
    try:
        import sglang  # noqa: F401
        from sglang.srt.entrypoints.engine import Engine
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} (import failed: {err})") from None
    return Engine


def stderr_tail(lines: int = LOG_TAIL_LINES) -> str:
    """Last lines of the file this process's stderr goes to (Ray's worker log), where SGLang's
    children write their tracebacks; empty when stderr is a terminal or pipe."""
    try:
        target = Path(os.readlink("/proc/self/fd/2"))
        if not target.is_file():
            return ""
        with target.open("rb") as f:
            f.seek(max(0, target.stat().st_size - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def generate_until_quota(
    engine,
    input_ids: Sequence[Sequence[int]],
    sampling_params: list[dict[str, Any]],
    quota: GroupQuota,
    **extra: Any,
):
    """The coroutine of a quota-bounded generate on an sglang.Engine: one request per row, each
    with its own rid, the unfinished ones aborted by rid once `quota` is met (their replies are
    SGLang's abort replies, finish_reason "abort", with the output so far where it sent it)."""
    rids = [f"rlinf-{uuid.uuid4().hex}" for _ in input_ids]

    def submit(row: int):
        return engine.async_generate(
            input_ids=list(input_ids[row]), sampling_params=sampling_params[row],
            return_logprob=True, rid=rids[row], **extra,
        )  # fmt: skip

    def abort(row: int) -> None:
        engine.tokenizer_manager.abort_request(rids[row])

    return run_until_quota(submit, quota, abort)


class SGLangEngine:
    def __init__(self, engine_kwargs: dict[str, Any], *, where: str) -> None:
        """`where` names the engine in every error (role, rank, GPUs)."""
        Engine = import_sglang()
        self.where = where
        self.kwargs = dict(engine_kwargs)
        self.memory_saver = bool(engine_kwargs.get("enable_memory_saver"))
        self.released: set[str] = set()
        self.weights_stale = False  # weights released and not pushed again since
        self._died: asyncio.Future | None = None
        self._in_blocking_call = False  # an sglang.Engine method is running the loop itself
        _sigquit_seen.clear()  # an earlier engine's death in this process is not this one's
        enable_rlinf_hooks()  # rlinf's lighter sampler in the engine's scheduler (sglang_hooks.py)
        try:
            self.engine = Engine(**self.kwargs, custom_sigquit_handler=record_sigquit)
        except Exception as err:  # noqa: BLE001 - SGLang raises many kinds; all mean "did not start"
            raise EngineStartError(self._with_log(f"{where}: SGLang engine failed to start: {err}")) from None
        self._watch_children()

    # -- failure detection --------------------------------------------------------------------
    def _watch_children(self) -> None:
        """Replace the tokenizer manager's running-phase SIGQUIT handler (kill the tree) by ours."""
        loop = self.engine.loop

        async def start_handle_loop() -> None:
            # Inside the engine's running loop: SGLang's get_or_create_event_loop() asks for the
            # *running* loop, so called from anywhere else it would make a new loop, put the
            # response task there, and every generate would wait forever.
            self.engine.tokenizer_manager.auto_create_handle_loop()  # installs SGLang's handler first

        loop.run_until_complete(start_handle_loop())
        self._died = loop.create_future()
        if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
            loop.remove_signal_handler(signal.SIGQUIT)
            loop.add_signal_handler(signal.SIGQUIT, self._on_child_died)

    def _on_child_died(self) -> None:
        if self._died is not None and not self._died.done():
            self._died.set_result(True)
        if self._in_blocking_call:
            # The Engine method waits in its own run_until_complete for a reply the dead scheduler
            # will never send: cancelling the loop's tasks ends that wait (the engine is gone).
            for task in asyncio.all_tasks(self.engine.loop):
                task.cancel()

    def _with_log(self, message: str) -> str:
        tail = stderr_tail()
        return f"{message}\n--- last lines of the engine log ---\n{tail}" if tail else message

    def _raise_if_died(self) -> None:
        if (self._died is not None and self._died.done()) or _sigquit_seen:
            raise EngineDiedError(self._with_log(f"{self.where}: an SGLang engine process died"))

    def _run(self, coroutine) -> Any:
        """Run an engine coroutine on its loop; a child crash ends the wait with EngineDiedError."""
        self._raise_if_died()
        loop = self.engine.loop
        task = loop.create_task(coroutine)
        assert self._died is not None
        loop.run_until_complete(asyncio.wait([task, self._died], return_when=asyncio.FIRST_COMPLETED))
        if not task.done():
            task.cancel()
            loop.run_until_complete(asyncio.wait([task], timeout=5))  # let it unwind
            self._raise_if_died()
        return task.result()

    def _call(self, call: str, **kwargs: Any) -> Any:
        """A weight / cache call on a live engine. SGLang answers (success, message), or an object
        with .success (flush_cache); a failure raises with the engine's name."""
        self._raise_if_died()
        self._in_blocking_call = True
        try:
            result = getattr(self.engine, call)(**kwargs)
        except asyncio.CancelledError:
            self._raise_if_died()
            raise
        finally:
            self._in_blocking_call = False
        self._raise_if_died()
        ok, message = result if isinstance(result, tuple) else (getattr(result, "success", True), result)
        if not ok:
            raise EngineCallError(f"{self.where}: SGLang {call} failed: {message}")
        return result

    # -- generation ---------------------------------------------------------------------------
    def generate(
        self,
        input_ids: Sequence[Sequence[int]],
        sampling_params: list[dict[str, Any]],
        *,
        return_routed_experts: bool = False,
        quota: GroupQuota | None = None,
    ) -> list[dict | None]:
        """One reply per request. With `quota` (rows = requests) each request runs on its own and
        the unfinished ones are aborted once the quota is met: their replies are the abort replies
        (None where the aborted request raised)."""
        if self.weights_stale:
            raise RuntimeError(
                f"{self.where}: generate after the engine's weights were released and not pushed again "
                "(released weights are lost; sync weights after wake)"
            )
        if self.released & {"kv_cache", "cuda_graph"}:
            raise RuntimeError(
                f"{self.where}: generate while {sorted(self.released)} are released (call wake)"
            )
        extra = {"return_routed_experts": True} if return_routed_experts else {}
        if quota is not None:
            return self._run(generate_until_quota(self.engine, input_ids, sampling_params, quota, **extra))
        outputs = self._run(
            self.engine.async_generate(
                input_ids=[list(p) for p in input_ids],
                sampling_params=sampling_params,
                return_logprob=True,
                **extra,
            )
        )
        return outputs if isinstance(outputs, list) else [outputs]

    # -- weights ------------------------------------------------------------------------------
    def load_tensors(self, named_tensors, *, flattened: bool = False) -> None:
        """One bucket: HF-named tensors (CPU or CUDA), or with `flattened` the per-TP-rank list of
        serialized flattened_bucket payloads. The cache is flushed once, by `flush_cache`."""
        self._call(
            "update_weights_from_tensor",
            named_tensors=named_tensors,
            load_format="flattened_bucket" if flattened else None,
            flush_cache=False,
        )

    def join_weight_group(
        self, host: str, port: int, rank_offset: int, world_size: int, group_name: str
    ) -> None:
        self._call(
            "init_weights_update_group",
            master_address=host,
            master_port=port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend="nccl",
        )

    def receive_broadcast(self, names, dtypes, shapes, group_name: str) -> None:
        self._call(
            "update_weights_from_distributed",
            names=list(names), dtypes=list(dtypes), shapes=[list(s) for s in shapes],
            group_name=group_name, flush_cache=False,
        )  # fmt: skip

    def weight_checksums(self) -> dict[str, str]:
        """One hash per tensor the engine serves (parameters and buffers, after SGLang's own
        post-load transforms such as MLA's absorbed w_kc / w_vc), from SGLang's weight checker:
        two equal maps mean the engine holds the same weights, tensor for tensor."""
        from sglang.srt.managers.io_struct import CheckWeightsReqInput

        ok, message, ranks = self._run(
            self.engine.tokenizer_manager.check_weights(CheckWeightsReqInput(action="checksum"), None)
        )
        if not ok or not ranks:
            raise EngineCallError(f"{self.where}: SGLang check_weights(checksum) failed: {message}")
        return {f"tp{rank['parallelism_info']['tp_rank']}/{name}": digest
                for rank in ranks for name, digest in rank["checksums"].items()}  # fmt: skip

    def flush_cache(self) -> None:
        """After a weight push: drop the radix cache (KV of prompts under the old weights)."""
        self._call("flush_cache")
        self.weights_stale = False

    # -- memory -------------------------------------------------------------------------------
    def release(self, tags: Sequence[str] = ALL_MEMORY_TAGS) -> None:
        """Give GPU memory back (engine idle). Released weights are lost, not offloaded."""
        todo = [t for t in tags if t not in self.released]
        if not self.memory_saver or not todo:
            return
        self._call("release_memory_occupation", tags=todo)
        self.released.update(todo)
        if "weights" in todo:
            self.weights_stale = True

    def resume(self, tags: Sequence[str] = ALL_MEMORY_TAGS) -> None:
        todo = [t for t in tags if t in self.released]
        if not todo:
            return
        self._call("resume_memory_occupation", tags=todo)
        self.released.difference_update(todo)

    def shutdown(self) -> None:
        self.engine.shutdown()
