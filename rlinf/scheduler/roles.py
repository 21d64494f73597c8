"""Launch the actor, rollout and reward worker groups where the recipe places them."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf.config.schema import Config
from rlinf.config.validate import placement_of, total_gpus
from rlinf.scheduler.worker_group import WorkerGroup
from rlinf.workers.backends import ACTOR_BACKENDS, REWARD_WORKER, ROLLOUT_BACKENDS


@dataclass
class Roles:
    actor: WorkerGroup
    rollout: WorkerGroup
    reward: WorkerGroup
    colocated: bool

    def shutdown(self) -> None:
        try:  # let the grading pool's processes exit with their parent
            self.reward.call("close")
        except Exception:  # noqa: BLE001 - best effort while tearing down after a failure
            pass
        for group in (self.reward, self.rollout, self.actor):
            group.kill()


def launch_roles(cfg: Config) -> Roles:
    placement = placement_of(cfg)
    pg = _gpu_placement_group(total_gpus(cfg))
    colocated = placement.is_colocated("actor", "rollout")
    share = 0.5 if colocated else 1.0  # colocated roles split each GPU's Ray resource

    def gpu_group(role: str, target: str, workers_per_gpu_set: int) -> WorkerGroup:
        gpus = placement.gpus[role]
        if not gpus:
            return WorkerGroup(role, target, (cfg,), num_workers=1)
        return WorkerGroup(
            role,
            target,
            (cfg,),
            num_workers=workers_per_gpu_set,
            gpu_share=share,
            placement_group=pg,
            bundle_indices=list(gpus[:workers_per_gpu_set]),
        )

    actor_workers = len(placement.gpus["actor"]) if cfg.actor.training_backend == "megatron" else 1
    rollout_workers = 1
    if cfg.rollout.rollout_backend == "sglang":
        rollout_workers = len(placement.gpus["rollout"]) // cfg.rollout.tensor_parallel_size
    actor = gpu_group("actor", ACTOR_BACKENDS[cfg.actor.training_backend], actor_workers)
    rollout = gpu_group("rollout", ROLLOUT_BACKENDS[cfg.rollout.rollout_backend], rollout_workers)
    reward = WorkerGroup("reward", REWARD_WORKER, (cfg,), num_workers=1)
    return Roles(actor=actor, rollout=rollout, reward=reward, colocated=colocated)


def _gpu_placement_group(num_gpus: int):
    if num_gpus == 0:
        return None
    import ray
    from ray.util.placement_group import placement_group

    pg = placement_group([{"GPU": 1, "CPU": 1}] * num_gpus, strategy="PACK")
    ray.get(pg.ready())
    return pg
