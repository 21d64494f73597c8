"""Worker groups of several ranks: one process group, prompt failure reports, dead ranks named."""

import time

import pytest
import ray

from rlinf.scheduler.worker_group import WorkerDiedError, WorkerError, WorkerGroup

WORKERS = "tests.integration.rank_workers"


@pytest.fixture
def two_ranks(ray_session):
    group = WorkerGroup("actor", f"{WORKERS}:CollectiveWorker", (), num_workers=2, distributed=True)
    yield group
    group.kill()


def test_ranks_share_one_gloo_group_with_the_torch_environment(two_ranks):
    assert two_ranks.call("all_reduce_rank_plus_one") == [3.0, 3.0]
    env = two_ranks.call("environment")
    assert [e["RANK"] for e in env] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in env} == {"2"} and {e["backend"] for e in env} == {"gloo"}
    assert [e["LOCAL_RANK"] for e in env] == ["0", "1"]  # one node
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in env}) == 1


def test_a_groups_env_is_in_each_ranks_process_beside_the_jobs_own(ray_session):
    group = WorkerGroup(
        "actor",
        f"{WORKERS}:CollectiveWorker",
        (),
        num_workers=2,
        distributed=True,
        env={"RLINF_TEST_VAR": "7"},
    )
    plain = WorkerGroup("rollout", f"{WORKERS}:CollectiveWorker", (), num_workers=1)
    try:
        assert group.call("all_reduce_rank_plus_one") == [3.0, 3.0]
        assert ray.get([h.environment_variable.remote("RLINF_TEST_VAR") for h in group.handles]) == ["7", "7"]
        # the job's PYTHONPATH (this checkout) is kept: the ranks imported the worker class through it
        assert all(ray.get([h.environment_variable.remote("PYTHONPATH") for h in group.handles]))
        assert ray.get(plain.handles[0].environment_variable.remote("RLINF_TEST_VAR")) is None
    finally:
        group.kill()
        plain.kill()


def test_a_backend_may_init_the_process_group_itself(ray_session):
    group = WorkerGroup("actor", f"{WORKERS}:SelfInitWorker", (), num_workers=2, distributed=True)
    try:
        assert group.call("all_reduce_rank_plus_one") == [3.0, 3.0]
    finally:
        group.kill()


@pytest.mark.parametrize("peers", ["all_reduce", "hang"])
def test_a_rank_dying_while_its_peer_waits_in_a_collective_is_named_promptly(two_ranks, peers):
    started = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"actor worker \(rank 1\) died"):
        two_ranks.call("die_on_rank", 1, peers)
    assert time.monotonic() - started < 10, "the group must not wait for rank 0's collective to time out"


def test_a_failing_rank_is_named_with_its_error(two_ranks):
    with pytest.raises(WorkerError, match=r"actor worker \(rank 1\) failed: ValueError: rank 1 refuses"):
        two_ranks.call("raise_on_rank", 1)


def test_call_each_gives_every_rank_its_own_arguments_and_skips_none(two_ranks):
    assert two_ranks.call_each("raise_on_rank", [(5,), None]) == [0, None]
