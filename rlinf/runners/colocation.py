"""The colocated memory order: actor and rollout take turns on the same GPUs.

    generate -> rollout releases KV cache and weights -> actor onloads -> logprobs + train
    -> actor empties its allocator cache -> rollout resumes its weights -> weight sync
    -> actor offloads (offload_between_phases only) -> rollout resumes its KV cache

Each transition is logged, timed (time/<transition>) and, on CUDA, followed by the GPU memory in use
(memory/<transition>_gib, the fullest GPU of the actor's ranks). `offload_between_phases: auto`
offloads in step 1 and measures the rollout's peak with a resident actor; if it leaves AUTO_HEADROOM
of the GPU free, later steps keep the actor resident, since offload and onload cost seconds a step.
The decision is logged and reported once (memory/auto_resident_peak_gib, actor/offload_between_phases).
Disaggregated and CPU placements run only the weight sync; an overlapped run (runner.max_staleness
>= 1, both roles resident) runs none of it. A resume pushes the restored weights in
the same order (`sync_after_load`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager

from rlinf.scheduler.roles import Roles
from rlinf.utils.metrics import PhaseTimer

logger = logging.getLogger(__name__)
AUTO_HEADROOM = 0.05  # share of the GPU left free above the measured peak (activations, fragmentation)


class ColocatedMemory:
    def __init__(
        self, roles: Roles, *, offload_actor: bool | str, timer: PhaseTimer, overlapped: bool = False
    ) -> None:
        self.roles = roles
        # runner.max_staleness >= 1 overlaps the roles: both stay resident, no transitions
        self.active = roles.colocated and not overlapped
        self.deciding = offload_actor == "auto"  # step 1 offloads and measures
        self.offload_actor = bool(offload_actor)
        self.timer = timer
        self.memory: dict[str, float] = {}
        self.actor_offloaded = False

    def start(self) -> None:
        """Before the first rollout: the actor leaves the GPUs if it is to be offloaded (a resume's
        sync has already offloaded it)."""
        if self.active and self.offload_actor and not self.actor_offloaded:
            self._transition("actor_offload", self.roles.actor.offload)

    def before_actor(self) -> None:
        """After generate/score, before compute_logprobs."""
        if not self.active:
            return
        self._transition("rollout_release", self.roles.rollout.sleep)
        self._transition("actor_onload", self.roles.actor.onload)

    def sync_and_resume(self, sync: Callable[[], object]) -> None:
        """After train: weights into the rollout, the actor out of the way, the rollout back."""
        if not self.active:
            with self.timer.phase("weight_sync"):
                sync()
            return
        self._sync_in_order(sync)
        if self.deciding:
            self._decide_offload()

    def sync_after_load(self, sync: Callable[[], object]) -> None:
        """Weights restored outside a step (a resume): the step's order from the engine's release on,
        since the engine is up with its KV cache. Not a step: nothing is timed into step metrics,
        and `auto` still decides from step 1."""
        if not self.active:
            sync()
            return
        self.before_actor()
        self._sync_in_order(sync)
        self.pop_metrics()
        self.timer.pop()

    def _sync_in_order(self, sync: Callable[[], object]) -> None:
        # Training leaves its activations' blocks in the actor's allocator cache: the engine's
        # weights would not fit beside them (a 10-layer Moonlight slice on one H200 did not).
        self.roles.actor.empty_device_cache()
        self._transition("rollout_resume_weights", lambda: self.roles.rollout.wake(["weights"]))
        self._transition("weight_sync", sync)
        if self.offload_actor:
            self._transition("actor_offload", self.roles.actor.offload)
        self._transition(
            "rollout_resume_kv_cache", lambda: self.roles.rollout.wake(["kv_cache", "cuda_graph"])
        )

    def _decide_offload(self) -> None:
        """auto: after the first offloaded step, keep the actor resident if it would fit."""
        self.deciding = False
        m = self.memory
        engine_up = m.get("memory/rollout_resume_kv_cache_gib")
        before, after = m.get("memory/weight_sync_gib"), m.get("memory/actor_offload_gib")
        freed = m.get("actor/offload_freed_gib", None if before is None or after is None else before - after)
        total = self.roles.actor.device_memory_total_gib()
        if engine_up is None or freed is None or total is None:
            logger.info("offload_between_phases auto: no GPU memory readings, keeps offloading")
            return
        peak = engine_up + freed
        self.offload_actor = peak > total * (1 - AUTO_HEADROOM)
        m["memory/auto_resident_peak_gib"] = peak
        m["actor/offload_between_phases"] = float(self.offload_actor)
        logger.info(
            "offload_between_phases auto: resident peak %.2f GiB (engine up %.2f + actor %.2f) of %.2f GiB "
            "with %.0f%% headroom -> %s",
            peak, engine_up, freed, total, 100 * AUTO_HEADROOM,
            "keeps offloading" if self.offload_actor else "actor stays resident from the next step",
        )  # fmt: skip

    @contextmanager
    def around_checkpoint(self):
        """A checkpoint save onloads an offloaded actor (it needs the weights and optimizer state on
        the GPU) while the engine is up; the engine's KV cache and CUDA graphs, the bulk of its
        memory, step aside for it. Its weights stay, so no weight sync is needed afterwards."""
        if not (self.active and self.offload_actor):
            yield
            return
        # Not a step transition: nothing timed or recorded into the step's metrics.
        logger.info("colocated memory: the rollout's KV cache and CUDA graphs step aside for the checkpoint")
        self.roles.rollout.sleep(["kv_cache", "cuda_graph"])
        try:
            yield
        finally:
            self.roles.rollout.wake(["kv_cache", "cuda_graph"])

    def pop_metrics(self) -> dict[str, float]:
        memory, self.memory = self.memory, {}
        return memory

    def _transition(self, name: str, action: Callable[[], object]) -> None:
        started = time.perf_counter()
        with self.timer.phase(name):
            reported = action()
        if name in ("actor_offload", "actor_onload"):
            self.actor_offloaded = name == "actor_offload"
        if isinstance(reported, dict):  # the actor offload's metrics (actor/offload_freed_gib on a GPU)
            self.memory.update(reported)
        used = self.roles.actor.device_memory_used_gib()
        if used is not None:
            self.memory[f"memory/{name}_gib"] = used
        logger.info(
            "colocated memory: %s took %.2fs%s",
            name,
            time.perf_counter() - started,
            "" if used is None else f", GPU memory in use {used:.2f} GiB",
        )
