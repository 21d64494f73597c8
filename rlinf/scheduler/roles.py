"""Launch the actor, rollout and reward worker groups where the recipe places them.

Group sizes follow the backend:
- torch actor: `actor.num_workers` data-parallel replicas (one per placed GPU, or CPU workers);
- megatron actor: one rank per placed actor GPU (TP x PP x CP x DP);
- sglang rollout: one engine worker per `rollout.tensor_parallel_size` placed GPUs (the engine
  starts its own TP processes); torch rollout: one worker;
- reward: one worker (its grading pool has `reward.num_workers` processes).
The actor group is `distributed` (one torch.distributed process group); rollout engines are not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rlinf.config.schema import Config
from rlinf.config.validate import placement_of, total_gpus
from rlinf.models.megatron.fp32_gemms import exact_fp32_env
from rlinf.scheduler.facades import ActorGroup, RewardGroup, RolloutGroup
from rlinf.scheduler.worker_group import WorkerGroup
from rlinf.workers.backends import ACTOR_BACKENDS, REWARD_WORKER, ROLLOUT_BACKENDS

CLOSE_TIMEOUT_S = 30.0  # for the workers' close calls at shutdown


@dataclass
class Roles:
    actor: ActorGroup
    rollout: RolloutGroup
    reward: RewardGroup
    colocated: bool  # actor and rollout share GPUs (never true on a CPU-only placement)
    # Seconds each role's group took to start (constructors included: weights loaded, engine up)
    startup_seconds: dict[str, float] = field(default_factory=dict)

    def shutdown(self) -> None:
        # The grading pool's and the engines' own processes stop first (an SGLang engine's
        # scheduler would otherwise hold its GPU memory until the kernel reaps it), then the
        # workers. A worker still busy (Ctrl-C in the middle of a rollout) runs its close only
        # after that call: wait CLOSE_TIMEOUT_S at most, then kill it anyway.
        import ray

        closing = [ref for group in (self.reward, self.rollout) for ref in group.call_async("close")]
        try:
            ray.wait(closing, num_returns=len(closing), timeout=CLOSE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - best effort while tearing down after a failure
            pass
        for group in (self.reward, self.rollout, self.actor):
            group.kill()


def startup_metrics(ray_seconds: float, roles: Roles) -> dict[str, float]:
    """Where the run's start-up went, logged at step 0: Ray, then each role's group in turn."""
    seconds = roles.startup_seconds
    return {
        "time/startup_ray": ray_seconds,
        "time/startup_actor": seconds["actor"],
        "time/startup_rollout": seconds["rollout"],
        "time/startup_reward": seconds["reward"],
    }


def startup_line(startup: dict[str, float]) -> str:
    parts = ", ".join(f"{name.removeprefix('time/startup_')} {value:.1f}" for name, value in startup.items())
    return f"start-up {sum(startup.values()):.1f} s: {parts}"


def group_sizes(cfg: Config) -> dict[str, int]:
    """Ranks per role for this recipe and placement (pure: no Ray)."""
    placement = placement_of(cfg)
    actor_gpus, rollout_gpus = len(placement.gpus["actor"]), len(placement.gpus["rollout"])
    if cfg.actor.training_backend == "megatron":
        actor = max(actor_gpus, 1)
    else:
        actor = cfg.actor.num_workers
    rollout = 1
    if cfg.rollout.rollout_backend == "sglang":
        rollout = max(rollout_gpus // cfg.rollout.tensor_parallel_size, 1)
    return {"actor": actor, "rollout": rollout, "reward": 1}


def launch_roles(cfg: Config) -> Roles:
    placement = placement_of(cfg)
    pg = _gpu_placement_group(total_gpus(cfg))
    colocated = placement.is_colocated("actor", "rollout")
    share = 0.5 if colocated else 1.0  # colocated roles split each GPU's Ray resource
    sizes = group_sizes(cfg)

    def gpu_group(
        role: str,
        target: str,
        gpus_per_rank: int,
        distributed: bool = False,
        env: dict[str, str] | None = None,
    ) -> WorkerGroup:
        gpus = placement.gpus[role]
        if not gpus:
            return WorkerGroup(
                role, target, (cfg,), num_workers=sizes[role], distributed=distributed, env=env
            )
        # A rank's bundle is the first GPU of its share (an SGLang engine starts its other TP
        # processes on the following GPUs itself).
        return WorkerGroup(
            role,
            target,
            (cfg,),
            num_workers=sizes[role],
            gpu_share=share,
            placement_group=pg,
            bundle_indices=[gpus[rank * gpus_per_rank] for rank in range(sizes[role])],
            distributed=distributed,
            env=env,
        )

    startup: dict[str, float] = {}

    def timed(role: str, start):
        started = time.perf_counter()
        group = start()
        startup[role] = time.perf_counter() - started
        return group

    # An fp32 actor's processes start with exact fp32 GEMMs (Transformer Engine asks for TF32)
    actor_env = exact_fp32_env(cfg.actor.model.precision)
    actor_target = ACTOR_BACKENDS[cfg.actor.training_backend]
    actor = timed("actor", lambda: gpu_group("actor", actor_target, 1, distributed=True, env=actor_env))
    rollout_tp = cfg.rollout.tensor_parallel_size if cfg.rollout.rollout_backend == "sglang" else 1
    rollout_target = ROLLOUT_BACKENDS[cfg.rollout.rollout_backend]
    rollout = timed("rollout", lambda: gpu_group("rollout", rollout_target, rollout_tp))
    reward = timed("reward", lambda: WorkerGroup("reward", REWARD_WORKER, (cfg,), num_workers=1))
    return Roles(
        actor=ActorGroup(actor),
        rollout=RolloutGroup(rollout),
        reward=RewardGroup(reward),
        colocated=colocated,
        startup_seconds=startup,
    )


def _gpu_placement_group(num_gpus: int):
    if num_gpus == 0:
        return None
    import ray
    from ray.util.placement_group import placement_group

    pg = placement_group([{"GPU": 1, "CPU": 1}] * num_gpus, strategy="PACK")
    ray.get(pg.ready())
    return pg
