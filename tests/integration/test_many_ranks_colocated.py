"""The colocated memory order, as the real workers saw their verbs called by the runner."""

from dataclasses import replace

import pytest

from rlinf.models.hf_checkpoint import load_tokenizer
from rlinf.runners.data_setup import build_datasets
from rlinf.runners.grpo_runner import GRPORunner
from rlinf.scheduler.facades import ActorGroup, GroupFacade, RewardGroup, RolloutGroup
from rlinf.scheduler.roles import Roles
from rlinf.scheduler.worker_group import WorkerGroup
from rlinf.utils.metrics import MetricLogger
from rlinf.workers.backends import REWARD_WORKER
from tests.integration.conftest import small_config
from tests.integration.rank_workers import read_journal

pytestmark = pytest.mark.slow
WORKERS = "tests.integration.rank_workers"

STEP_COLOCATED = [
    "rollout.generate",
    "rollout.sleep",  # releases KV cache and weights
    "actor.onload",
    "actor.compute_logprobs",
    "actor.train",
    "rollout.wake:weights",
    "actor.export_weights",  # weight sync
    "rollout.update_weights",
    "actor.offload",
    "rollout.wake:kv_cache,cuda_graph",
]


def run_two_steps(cfg, colocated: bool) -> tuple[list[str], dict]:
    train, val, _ = build_datasets(cfg, load_tokenizer(cfg.actor.model.model_path))
    roles = Roles(
        actor=ActorGroup(WorkerGroup("actor", f"{WORKERS}:JournalingTorchActor", (cfg,), distributed=True)),
        rollout=RolloutGroup(WorkerGroup("rollout", f"{WORKERS}:JournalingTorchRollout", (cfg,))),
        reward=RewardGroup(WorkerGroup("reward", REWARD_WORKER, (cfg,))),
        # The CPU has no GPUs to share; mark the roles colocated to drive the order through real workers.
        colocated=colocated,
    )
    try:
        metrics = MetricLogger(cfg.runner.logger.log_path, ())
        GRPORunner(cfg, roles, train, val, metrics).run()
    finally:
        roles.shutdown()
    return read_journal(cfg.runner.output_dir), metrics.history()[-1]


@pytest.mark.parametrize("offload", [True, False])
def test_colocated_steps_follow_the_memory_order(random_tiny_checkpoint, tmp_path, ray_session, offload):
    cfg = small_config(
        random_tiny_checkpoint, tmp_path, **{"runner.max_steps": 2, "runner.val_check_interval": 0}
    )
    # Validation refuses offload_between_phases without shared GPUs; the CPU stands in for them here.
    cfg = replace(cfg, actor=replace(cfg.actor, offload_between_phases=offload))
    verbs, last = run_two_steps(cfg, colocated=True)
    step = STEP_COLOCATED if offload else [v for v in STEP_COLOCATED if v != "actor.offload"]
    start = ["actor.offload"] if offload else []  # the actor leaves the GPU before the first rollout
    # the run's last checkpoint: an offloaded actor onloads for it, the engine's KV cache steps aside
    save = ["rollout.sleep:kv_cache,cuda_graph", "rollout.wake:kv_cache,cuda_graph"] if offload else []
    # shutdown: the rollout closes its engine before its worker is killed
    assert verbs == start + step + step + save + ["rollout.close"]
    for transition in (
        "rollout_release",
        "actor_onload",
        "rollout_resume_weights",
        "rollout_resume_kv_cache",
    ):
        assert last[f"time/{transition}"] > 0
    assert ("time/actor_offload" in last) == offload


def test_a_placement_without_shared_gpus_skips_the_memory_order(
    random_tiny_checkpoint, tmp_path, ray_session
):
    cfg = small_config(
        random_tiny_checkpoint, tmp_path, **{"runner.max_steps": 1, "runner.val_check_interval": 0}
    )
    cfg = replace(cfg, actor=replace(cfg.actor, offload_between_phases=True))
    verbs, last = run_two_steps(cfg, colocated=False)
    assert verbs == [
        "rollout.generate",
        "actor.compute_logprobs",
        "actor.train",
        "actor.export_weights",
        "rollout.update_weights",
        "rollout.close",
    ]
    assert last["time/weight_sync"] > 0 and "time/rollout_release" not in last


def test_shutdown_kills_a_worker_still_busy_after_the_close_timeout(ray_session, monkeypatch):
    import time

    import ray

    from rlinf.scheduler import roles as roles_module

    monkeypatch.setattr(roles_module, "CLOSE_TIMEOUT_S", 1.0)
    groups = {role: WorkerGroup(role, f"{WORKERS}:BusyWorker", ()) for role in ("actor", "rollout", "reward")}
    roles = Roles(
        actor=GroupFacade(groups["actor"]),
        rollout=RolloutGroup(groups["rollout"]),
        reward=RewardGroup(groups["reward"]),
        colocated=True,
    )
    nap = groups["rollout"].call_async("busy", 120)  # e.g. Ctrl-C in the middle of a rollout
    started = time.perf_counter()
    roles.shutdown()
    assert time.perf_counter() - started < 30  # not the 120 s the busy call would take
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(nap, timeout=30)  # killed, not finished
