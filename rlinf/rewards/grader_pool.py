"""Batch math reward: grades responses in a pool of worker processes with per-item timeouts.

Each worker is a long-lived spawned process with its own pipe. The parent sends a worker a
chunk of items and the worker answers item by item, so the parent always knows which item
a worker is on and since when. A worker that spends more than timeout_s on one item is
killed and replaced; that item is scored wrong and counted, and the rest of its chunk is
handed out again. concurrent.futures cannot do this: it can neither kill one stuck task
nor survive a worker being killed.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from rlinf.rewards.math_grader import answer_region, grade

# A fresh worker imports sympy and builds the LaTeX parser (a few seconds); that time must
# not count against any item, and a worker that cannot start at all is a setup error.
WORKER_START_TIMEOUT_S = 120.0
MAX_FAILED_STARTS = 3  # consecutive worker deaths during start-up before scoring gives up
MAX_CHUNK_SIZE = 32
# Graded once by each new worker before it reports ready: sympy imports and caches a lot on
# first use, which would otherwise slow (and risk timing out) a worker's first real items.
_WARM_UP = [
    ("\\boxed{(x+2)(x+3)}", ["x^2+5x+6"]),
    ("\\boxed{(-2, 5]}", ["(5,-2)"]),
    ("\\boxed{\\{\\sqrt{2}, 1\\}}", ["\\{1,\\sqrt{2}\\}"]),
    ("\\boxed{3.1416}", ["\\pi"]),
    ("\\boxed{2\\sqrt{3}}", ["\\frac{\\sqrt{12}}{1}"]),
    ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", ["\\begin{pmatrix}2\\\\1\\end{pmatrix}"]),
    ("\\boxed{\\pm 3}", ["3,-3"]),
]


@dataclass
class RewardResult:
    rewards: list[float]  # +reward_scale for a right answer, -reward_scale otherwise
    correct: list[bool]
    timeouts: int  # items scored wrong because grading did not finish (or its worker died)
    # reward.overlong_buffer: each response's length penalty, already added to `rewards`; None when off
    overlong_penalties: list[float] | None = None


def _worker_main(conn: Connection) -> None:
    for response, solutions in _WARM_UP:
        grade(response, solutions)
    try:
        conn.send("ready")
        while (chunk := conn.recv()) is not None:
            for index, response, solutions in chunk:
                conn.send((index, grade(response, solutions)))
    except (EOFError, BrokenPipeError):  # the parent is gone
        return


class _Worker:
    def __init__(self, ctx) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child_conn,), daemon=True)
        self.process.start()
        child_conn.close()  # so that recv() raises EOFError if the worker dies
        self.started_at = time.monotonic()
        self.ready = False
        self.pending: deque[int] = deque()  # indices sent and not yet answered, in order
        self.item_deadline = float("inf")  # when the item at pending[0] times out

    def send(self, chunk: list[int], items: list[tuple[str, tuple[str, ...]]], timeout_s: float) -> None:
        self.conn.send([(i, *items[i]) for i in chunk])
        self.pending = deque(chunk)
        self.item_deadline = time.monotonic() + timeout_s

    def stop(self, kill: bool) -> None:
        if not kill:
            try:
                self.conn.send(None)
                self.process.join(timeout=2.0)
            except (OSError, ValueError):
                pass
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5.0)
        self.conn.close()


class MathReward:
    """Scores math responses: +reward_scale if the last boxed answer is right, else -reward_scale."""

    def __init__(self, reward_scale: float = 5.0, timeout_s: float = 5.0, num_workers: int = 2) -> None:
        if timeout_s <= 0 or num_workers < 1:
            raise ValueError(f"need timeout_s > 0 and num_workers >= 1, got {timeout_s}, {num_workers}")
        self.reward_scale = reward_scale
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")  # fork is unsafe in threaded (Ray, torch) parents
        self._workers = [_Worker(self._ctx) for _ in range(num_workers)]
        self._lock = threading.Lock()
        self._failed_starts = 0
        self._closed = False

    def score(self, responses: Sequence[str], solutions: Sequence[Sequence[str]]) -> RewardResult:
        if len(responses) != len(solutions):
            raise ValueError(f"{len(responses)} responses but {len(solutions)} solution lists")
        # grade() reads only a response's last box onward; sending just that keeps the pipes light.
        items = [
            (answer_region(r), (s,) if isinstance(s, str) else tuple(s))
            for r, s in zip(responses, solutions, strict=True)
        ]
        with self._lock:
            if self._closed:
                raise RuntimeError("MathReward is closed")
            try:
                correct, timeouts = self._grade_all(items)
            except BaseException:
                # Interrupted mid-batch (e.g. KeyboardInterrupt): workers still busy with this
                # batch would send its results into the next one, so replace them.
                for slot, w in enumerate(self._workers):
                    if w.pending:
                        self._replace(slot)
                raise
        rewards = [self.reward_scale if ok else -self.reward_scale for ok in correct]
        return RewardResult(rewards=rewards, correct=correct, timeouts=timeouts)

    def _grade_all(self, items: list[tuple[str, tuple[str, ...]]]) -> tuple[list[bool], int]:
        correct = [False] * len(items)
        chunk_size = max(1, min(MAX_CHUNK_SIZE, len(items) // (8 * len(self._workers))))
        todo = deque(
            list(range(i, min(i + chunk_size, len(items)))) for i in range(0, len(items), chunk_size)
        )
        timeouts = 0
        while todo or any(w.pending for w in self._workers):
            for slot, w in enumerate(self._workers):
                if w.ready and not w.pending and todo:
                    chunk = todo.popleft()
                    try:
                        w.send(chunk, items, self.timeout_s)
                    except OSError:  # died while idle: nothing of this batch was lost
                        todo.appendleft(chunk)
                        self._replace(slot)

            now = time.monotonic()
            next_deadline = min(
                [w.item_deadline for w in self._workers if w.pending]
                + [w.started_at + WORKER_START_TIMEOUT_S for w in self._workers if not w.ready]
            )
            wait([w.conn for w in self._workers], timeout=max(0.0, next_deadline - now))

            for slot, w in enumerate(self._workers):
                died = False
                try:
                    while w.conn.poll():
                        message = w.conn.recv()
                        if message == "ready":
                            w.ready = True
                            self._failed_starts = 0
                            continue
                        index, ok = message
                        correct[index] = ok
                        w.pending.popleft()
                        w.item_deadline = time.monotonic() + self.timeout_s
                except (EOFError, OSError):
                    if not w.ready:
                        # Killed while importing (OOM killer, a stray signal): start another, but
                        # give up when workers cannot start at all (a broken install).
                        self._failed_starts += 1
                        if self._failed_starts > MAX_FAILED_STARTS:
                            raise RuntimeError(
                                f"grading workers died while starting {self._failed_starts} times in a row"
                            ) from None
                        self._replace(slot)
                        continue
                    died = True
                now = time.monotonic()
                if not w.ready and now > w.started_at + WORKER_START_TIMEOUT_S:
                    raise RuntimeError(f"a grading worker did not start within {WORKER_START_TIMEOUT_S} s")
                if died or (w.pending and now >= w.item_deadline):
                    if w.pending:
                        w.pending.popleft()  # the stuck item stays scored wrong
                        timeouts += 1
                    if w.pending:
                        todo.appendleft(list(w.pending))
                    self._replace(slot)
        return correct, timeouts

    def _replace(self, slot: int) -> None:
        self._workers[slot].stop(kill=True)
        self._workers[slot] = _Worker(self._ctx)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for w in self._workers:
                w.stop(kill=False)

    def __enter__(self) -> MathReward:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
