"""benchmarks/rank_emulation.py's MirrorGroup (every rank of a group holds what this rank holds) and
benchmarks/rank_prediction.py's FLOPs, collective bytes and step prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from benchmarks.actor_throughput import flops_per_token
from benchmarks.rank_emulation import MirrorGroup
from benchmarks.rank_prediction import (
    LinkAssumption,
    collectives_per_micro_batch,
    predict_actor_step,
    rank_flops_per_token,
    sequences_per_step,
)

MOONLIGHT = json.loads((Path(__file__).parents[1] / "fixtures" / "moonlight-16b-a3b-config.json").read_text())


def sum_op() -> dist.AllreduceOptions:
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    return opts


def test_gathers_copy_this_ranks_tensor_and_sums_scale_by_the_group():
    group = MirrorGroup(2, 4)
    chunk = torch.arange(6.0).view(3, 2)
    gathered = torch.empty(12, 2)
    group.all_gather_single(gathered, chunk).wait()
    assert torch.equal(gathered, chunk.repeat(4, 1))
    partial = torch.arange(8.0).view(4, 2)
    mine = torch.empty(1, 2)
    group.reduce_scatter_single(mine, partial).wait()  # rank 2's chunk, summed over 4 equal ranks
    assert torch.equal(mine, 4 * partial[2:3])
    total = torch.ones(3)
    group.allreduce([total], sum_op()).wait()
    assert torch.equal(total, torch.full((3,), 4.0))
    largest = torch.ones(3)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    group.allreduce([largest], opts).wait()
    assert torch.equal(largest, torch.ones(3))


def test_the_all_to_all_delivers_what_this_rank_sends_itself_and_the_way_back_its_sizes():
    group = MirrorGroup(1, 4)
    sent = torch.arange(10.0).unsqueeze(1)  # rows for ranks 0..3: 2, then 3 to itself, 1, 4
    received = torch.empty(12, 1)  # the dispatcher's all-gathered counts: 3 from every rank
    group.all_to_all_single(received, sent, [3, 3, 3, 3], [2, 3, 1, 4]).wait()
    assert torch.equal(received, sent[2:5].repeat(4, 1))
    back = torch.empty(10, 1)  # the combine: as many rows as went out to each rank
    group.all_to_all_single(back, received, [2, 3, 1, 4], [3, 3, 3, 3]).wait()
    assert torch.equal(back[2:5], received[3:6])  # its own rows, back from itself


def test_one_ranks_flops_are_the_models_over_the_ranks():
    whole = rank_flops_per_token(MOONLIGHT, 1, 1, 1, context=4096)
    assert 8 * rank_flops_per_token(MOONLIGHT, 8, 8, 1, context=4096) == pytest.approx(whole, rel=1e-12)
    # the benchmark's whole-model count, which leaves the norms out
    assert whole == pytest.approx(flops_per_token(MOONLIGHT, context=4096), rel=1e-4)


def test_collective_bytes_of_a_moonlight_micro_batch():
    tokens, h = 8192, 2048
    comm = collectives_per_micro_batch(MOONLIGHT, tokens, tp=8, ep=8)
    f = 7 / 8
    attention = f * tokens * (2 * h + 512 + 64)
    mlp = f * tokens * 2 * h
    dispatch = 2 * f * tokens / 8 * 6 * h
    expected = 27 * attention + 27 * mlp + 26 * dispatch + 2 * f * tokens * h
    assert comm["bytes"] == pytest.approx(2 * expected)
    assert collectives_per_micro_batch(MOONLIGHT, tokens, tp=1, ep=1) == {"bytes": 0.0, "count": 0}


def test_the_step_prediction_adds_the_collectives_to_the_measured_micro_batches():
    from rlinf.config import load_config

    cfg = load_config("moonlight-16b-grpo-megatron", [])
    assert sequences_per_step(cfg) == 64 * 8  # rollout_batch_size x group_size, DP 1
    link = LinkAssumption(gbps=100.0, latency_us=0.0)
    out = predict_actor_step(
        cfg,
        MOONLIGHT,
        train_call_s=2.0,
        logprob_call_s=0.5,
        sequences_per_call=4,
        sequences_per_micro_batch=1,
        tokens_per_micro_batch=9216,
        link=link,
    )
    comm_s = collectives_per_micro_batch(MOONLIGHT, 9216, 8, 8)["bytes"] / 100e9
    assert out["train_s_per_step"] == pytest.approx(512 * (0.5 + 2 * comm_s))
    assert out["logprob_s_per_step"] == pytest.approx(512 * (0.125 + comm_s))
    assert out["actor_s_per_step"] == pytest.approx(out["train_s_per_step"] + out["logprob_s_per_step"])


def test_a_logprob_forward_of_several_sequences_moves_the_same_bytes_in_fewer_collectives():
    from rlinf.config import load_config

    cfg = load_config("moonlight-16b-grpo-megatron", [])
    link = LinkAssumption(gbps=100.0, latency_us=20.0)
    shape = dict(train_call_s=2.0, logprob_call_s=0.5, sequences_per_call=4, sequences_per_micro_batch=1)
    out = predict_actor_step(
        cfg, MOONLIGHT, **shape, tokens_per_micro_batch=9216, logprob_sequences_per_micro_batch=4, link=link
    )
    one, four = (collectives_per_micro_batch(MOONLIGHT, t, 8, 8) for t in (9216, 4 * 9216))
    assert four["bytes"] == pytest.approx(4 * one["bytes"]) and four["count"] == one["count"]
    logprob_comm = 128 * (four["bytes"] / 100e9 + four["count"] * 20e-6)
    assert out["logprob_forwards_per_step_per_rank"] == 128
    assert out["logprob_s_per_step"] == pytest.approx(512 * 0.125 + logprob_comm)
    train_comm = 512 * 2 * (one["bytes"] / 100e9 + one["count"] * 20e-6)
    assert out["collective_s_per_step"] == pytest.approx(train_comm + logprob_comm)


@pytest.mark.parametrize(
    "rows, train_rows, logprob_rows",
    [({}, 2, 2), ({"micro_batch_size": 4}, 4, 4), ({"logprob_micro_batch_size": 4}, 2, 4)],
)
def test_the_benchmark_predicts_from_its_medians_and_its_batch_shape(rows, train_rows, logprob_rows):
    """--micro-batch 2 and no --logprob-micro-batch, or a variant's rows a forward instead."""
    from types import SimpleNamespace

    from benchmarks.actor_throughput import predicted_step

    args = SimpleNamespace(
        recipe="moonlight-16b-grpo-megatron",
        rows=8,
        micro_batch=2,
        logprob_micro_batch=None,
        prompt=1024,
        response=8192,
    )
    measured = {
        "seconds_per_train_call": 4.0,
        "seconds_per_optimizer_step": 1.0,
        "seconds_per_logprob_call": 1.0,
    }
    out = predicted_step(args, MOONLIGHT, measured, rows)
    link = LinkAssumption()

    def comm_s(sequences: int) -> float:
        forward = collectives_per_micro_batch(MOONLIGHT, sequences * 9216, 8, 8)
        return forward["bytes"] / (link.gbps * 1e9) + forward["count"] * link.latency_us * 1e-6

    train_forwards, logprob_forwards = 512 // train_rows, 512 // logprob_rows
    assert out["tokens_per_micro_batch"] == train_rows * 9216
    assert out["micro_batches_per_step_per_rank"] == train_forwards
    assert out["logprob_forwards_per_step_per_rank"] == logprob_forwards
    assert out["optimizer_steps_per_step"] == 4  # 512 sequences, global batch 128, DP 1
    assert out["actor_s_per_step"] == pytest.approx(
        512 * (3.0 + 1.0) / 8
        + 4 * 1.0
        + train_forwards * 2 * comm_s(train_rows)
        + logprob_forwards * comm_s(logprob_rows)
    )


def test_the_optimizer_phase_counts_once_per_global_batch_not_once_per_benchmark_call():
    """A 2 s call of 4 sequences whose optimizer phase takes 0.5 s: 1.5 s of passes per 4 sequences,
    and the recipe's 512 sequences at global batch 128 step the optimizer 4 times."""
    from rlinf.config import load_config

    cfg = load_config("moonlight-16b-grpo-megatron", [])
    link = LinkAssumption(gbps=1e12, latency_us=0.0)  # collectives free: the passes and the steps alone
    shape = dict(sequences_per_call=4, sequences_per_micro_batch=1, tokens_per_micro_batch=9216, link=link)
    out = predict_actor_step(
        cfg, MOONLIGHT, train_call_s=2.0, logprob_call_s=0.0, optimizer_step_s=0.5, **shape
    )
    assert out["optimizer_steps_per_step"] == 4
    assert out["train_s_per_step"] == pytest.approx(512 * 1.5 / 4 + 4 * 0.5, rel=1e-6)
    fewer = predict_actor_step(
        load_config("moonlight-16b-grpo-megatron", ["actor.global_batch_size=512"]),
        MOONLIGHT, train_call_s=2.0, logprob_call_s=0.0, optimizer_step_s=0.5, **shape,
    )  # fmt: skip
    assert fewer["optimizer_steps_per_step"] == 1
    assert fewer["train_s_per_step"] == pytest.approx(512 * 1.5 / 4 + 0.5, rel=1e-6)


def test_the_optimizer_phase_is_timed_from_the_grad_norm_to_the_steps_end(monkeypatch):
    """An actor whose passes take 0.2 s, grad norm 0.05 s and step 0.1 s: 0.15 s, the passes not
    included; the actor's own methods are back in place afterwards."""
    import time

    from benchmarks.actor_throughput import optimizer_step_seconds

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    class Actor:
        def clip_grad_norm(self, max_norm: float) -> float:
            time.sleep(0.05)
            return 1.0

        def optimizer_step(self) -> None:
            time.sleep(0.1)

        def train(self, data, step: int) -> None:
            time.sleep(0.2)
            self.clip_grad_norm(1.0)
            self.optimizer_step()

    actor = Actor()
    seconds = optimizer_step_seconds(actor, None, step=1)
    assert 0.15 <= seconds < 0.2
    assert "clip_grad_norm" not in vars(actor) and "optimizer_step" not in vars(actor)
