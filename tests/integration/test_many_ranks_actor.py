"""The torch actor's data parallelism: N DDP workers (gloo) compute the update of one worker."""

from dataclasses import replace

import pytest
import torch

from rlinf.algorithms import compute_advantages
from rlinf.models.hf_checkpoint import load_tokenizer
from rlinf.runners.data_setup import build_datasets
from rlinf.scheduler.facades import ActorGroup
from rlinf.scheduler.worker_group import WorkerGroup
from rlinf.workers.actor.base import LogprobRows
from rlinf.workers.backends import ACTOR_BACKENDS
from rlinf.workers.rollout.sampling import SamplingParams
from rlinf.workers.rollout.torch_rollout import TorchRollout
from tests.integration.conftest import small_config

pytestmark = pytest.mark.slow

# 16 responses, minibatches of 8 (two optimizer steps), micro-batches of 2: with 2 ranks each rank
# trains 2 micro-batches of its 4 rows per minibatch.
OVERRIDES = {
    "actor.global_batch_size": 8,
    "actor.micro_batch_size": 2,
    "actor.optim.lr": 1e-3,
    # Adam divides by |g| + eps: at eps 1e-8 a rounding difference in a gradient entry that nearly
    # cancels to 0 (the micro-batch sums are added in another order on 2 ranks) becomes an lr-sized
    # weight difference (seen: 1.3e-6). At 1e-4 the comparison measures the data-parallel maths.
    "actor.optim.adam_eps": 1e-4,
    "actor.optim.clip_grad": 1e9,  # no clipping: the grad norm below is the raw one on both sides
    "actor.model.precision": "fp32",
}


def scored_batch(cfg):
    train, _, _ = build_datasets(cfg, load_tokenizer(cfg.actor.model.model_path))
    batch = TorchRollout(cfg).generate(
        list(train)[:4], 4, SamplingParams.from_config(cfg.algorithm.sampling_params), seed=3
    )
    # Rewards that make every group's advantages non-zero; response lengths differ between rows,
    # so per-rank token counts differ and a rank-local normaliser would change the update.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    advantages = compute_advantages("grpo", rewards, batch.group_index).advantages
    return replace(batch, rewards=rewards, advantages=advantages)


def train_once(cfg, batch, workers: int):
    group = WorkerGroup("actor", ACTOR_BACKENDS["torch"], (cfg,), num_workers=workers, distributed=True)
    try:
        actor = ActorGroup(group)
        # what crosses back from the ranks: each DP rank's logprob rows, no batch
        crossed = group.call("compute_logprobs", batch)
        assert [type(c) for c in crossed] == [LogprobRows] * workers
        assert [(c.start, len(c), c.ref) for c in crossed] == [
            (i * 16 // workers, 16 // workers, None) for i in range(workers)
        ]
        with_logprobs = actor.compute_logprobs(batch)
        metrics = actor.train(with_logprobs, step=1)
        # offload's contract: metrics from every rank ({} on the CPU: nothing moves)
        assert group.call("offload") == [{}] * workers
        return with_logprobs, metrics, group.call("named_weights")
    finally:
        group.kill()


def test_two_ddp_workers_take_the_step_of_one(random_tiny_checkpoint, tmp_path, ray_session):
    cfg_one = small_config(random_tiny_checkpoint, tmp_path, **OVERRIDES)
    cfg_two = small_config(random_tiny_checkpoint, tmp_path, **{**OVERRIDES, "actor.num_workers": 2})
    batch = scored_batch(cfg_one)
    assert len(set(batch.response_mask.sum(1).tolist())) > 1, "test needs rows of different lengths"

    one_batch, one_metrics, (one_weights,) = train_once(cfg_one, batch, 1)
    two_batch, two_metrics, (rank0, rank1) = train_once(cfg_two, batch, 2)

    # logprob recompute: each rank did half the rows; the facade put them back in order
    assert torch.allclose(two_batch.old_logprobs, one_batch.old_logprobs, atol=1e-6)
    # DDP replicas stay identical
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    initial = TorchRollout(cfg_one).named_weights()
    moved = max(float((one_weights[k] - initial[k]).abs().max()) for k in one_weights)
    assert moved > 1e-4, "the step must move the weights well beyond the tolerance below"
    worst = max(float((rank0[k] - one_weights[k]).abs().max()) for k in one_weights)
    assert worst <= 1e-6, f"2-worker weights differ from 1-worker ones by {worst}"
    for name in ("actor/loss", "actor/policy_loss", "actor/grad_norm", "actor/ratio_max", "actor/entropy"):
        assert two_metrics[name] == pytest.approx(one_metrics[name], rel=1e-5, abs=1e-7), name


def rows_of_rank(
    num_rows: int, global_batch: int, seed: int, step: int, dp_rank: int, dp_size: int
) -> list[int]:
    """The batch rows that run_policy_update gives `dp_rank` (same shuffle, same minibatch cut)."""
    order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed + step)).tolist()
    share = global_batch // dp_size
    return [
        order[start + dp_rank * share + i] for start in range(0, num_rows, global_batch) for i in range(share)
    ]


@pytest.mark.parametrize(("threshold", "stops"), [(2.0, False), (1.5, True)])
def test_early_stop_is_decided_from_the_global_ratio(
    random_tiny_checkpoint, tmp_path, ray_session, threshold, stops
):
    # Rank 1's rows get old logprobs 1 nat lower: its local mean ratio is about e (2.7), rank 0's
    # about 1, the global one about 1.9. A rank-local decision at threshold 2 would stop rank 1
    # only and let the replicas drift apart.
    cfg = small_config(
        random_tiny_checkpoint,
        tmp_path,
        **{**OVERRIDES, "actor.num_workers": 2, "algorithm.early_stop_imp_ratio": threshold},
    )
    batch = scored_batch(cfg)
    group = WorkerGroup("actor", ACTOR_BACKENDS["torch"], (cfg,), num_workers=2, distributed=True)
    try:
        actor = ActorGroup(group)
        batch = actor.compute_logprobs(batch)
        shifted = rows_of_rank(len(batch), 8, cfg.runner.seed, 1, dp_rank=1, dp_size=2)
        old = batch.old_logprobs.clone()
        old[shifted] = torch.where(batch.response_mask[shifted], old[shifted] - 1.0, old[shifted])
        before = group.call_rank0("named_weights")
        metrics = actor.train(replace(batch, old_logprobs=old), step=1)
        rank0, rank1 = group.call("named_weights")
    finally:
        group.kill()
    assert metrics["actor/early_stopped_minibatches"] == (2.0 if stops else 0.0)
    if not stops:
        assert 1.5 < metrics["actor/ratio_mean"] < 2.0  # the premise: the global ratio sits between
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0), "the replicas took different branches"
    assert all(torch.equal(rank0[k], before[k]) for k in rank0) == stops


def test_a_run_with_two_actor_workers_trains_checkpoints_and_resumes(
    random_tiny_checkpoint, tmp_path, ray_session
):
    import json

    from rlinf.runners.main import run

    common = {
        "actor.num_workers": 2,
        "runner.val_check_interval": 0,
        "runner.save_interval": 1,
        "actor.lr_sched.lr_decay_steps": 8,  # the same LR schedule when the resume extends the run
    }
    assert run(small_config(random_tiny_checkpoint, tmp_path, **{**common, "runner.max_steps": 1})) == 0
    resumed = {**common, "runner.max_steps": 2, "runner.resume_dir": "auto"}
    assert run(small_config(random_tiny_checkpoint, tmp_path, **resumed)) == 0
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "actor/lr" in r]
    assert steps == [1, 2]
    assert (tmp_path / "results" / "it" / "checkpoints" / "step_2" / "actor" / "actor_state.pt").is_file()


def test_every_rank_restores_a_data_parallel_checkpoint(random_tiny_checkpoint, tmp_path, ray_session):
    cfg = small_config(random_tiny_checkpoint, tmp_path, **{**OVERRIDES, "actor.num_workers": 2})
    batch = scored_batch(cfg)
    trained = WorkerGroup("actor", ACTOR_BACKENDS["torch"], (cfg,), num_workers=2, distributed=True)
    try:
        actor = ActorGroup(trained)
        actor.train(actor.compute_logprobs(batch), step=1)
        actor.save(str(tmp_path / "ckpt"))
        saved = trained.call_rank0("named_weights")
    finally:
        trained.kill()
    fresh = WorkerGroup("actor", ACTOR_BACKENDS["torch"], (cfg,), num_workers=2, distributed=True)
    try:
        ActorGroup(fresh).load(str(tmp_path / "ckpt"))
        for weights in fresh.call("named_weights"):
            assert all(torch.equal(weights[k], saved[k]) for k in saved)
    finally:
        fresh.kill()
