"""algorithm.dynamic_sampling: the groups without signal are dropped, rounds of fresh prompts refill
the batch to exactly data.rollout_batch_size groups, the cap on rounds ends the step (which says
so), and a run resumed from the loader's saved position draws the same prompts as the original."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from rlinf.config import load_config
from rlinf.config.schema import DynamicSamplingConfig
from rlinf.data.batch import RolloutBatch
from rlinf.runners import grpo_runner
from rlinf.runners.dynamic_sampling import Round, fill_batch
from rlinf.scheduler.roles import Roles
from rlinf.utils.metrics import MetricLogger

ON = DynamicSamplingConfig(enable=True, max_gen_rounds=4)


def scored(
    prompts: list[int], rewards: list[list[float]], *, correct: list[list[bool]] | None = None
) -> RolloutBatch:
    """One group per prompt, a response per reward; the prompt id is the row's reference answer."""
    sizes = [len(r) for r in rewards]
    rows = sum(sizes)
    flat = torch.tensor([x for group in rewards for x in group])
    verdicts = flat > 0 if correct is None else torch.tensor([c for group in correct for c in group])
    lengths = torch.tensor([1 + i % 3 for i in range(rows)])
    return RolloutBatch(
        prompt_ids=torch.ones(rows, 2, dtype=torch.long),
        prompt_mask=torch.ones(rows, 2, dtype=torch.bool),
        response_ids=torch.full((rows, 3), 7),
        response_mask=torch.arange(3)[None] < lengths[:, None],
        group_index=torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor(sizes)),
        rollout_logprobs=torch.zeros(rows, 3),
        finish_reasons=["stop"] * rows,
        response_text=["x"] * rows,
        solutions=[(str(p),) for p, n in zip(prompts, sizes, strict=True) for _ in range(n)],
        rewards=flat.float(),
        correct=verdicts,
        extras={"reward/timeouts": 1.0, "time/routing_record": 0.5},
    )


class Rounds:
    """draw(i) returns the i-th prepared round and records the calls."""

    def __init__(self, *rounds: RolloutBatch) -> None:
        self.rounds = rounds
        self.calls: list[int] = []

    def __call__(self, index: int) -> Round:
        self.calls.append(index)
        batch = self.rounds[index]
        return Round(batch, len(batch.group_index.unique()))


def groups_of(batch: RolloutBatch) -> list[tuple[str, list[float]]]:
    """(prompt, rewards) of each group in the batch, in group-id order."""
    assert batch.rewards is not None
    out = []
    for g in sorted(set(batch.group_index.tolist())):
        rows = (batch.group_index == g).nonzero().flatten().tolist()
        prompts = {batch.solutions[r][0] for r in rows}
        assert len(prompts) == 1, f"group {g} mixes prompts {prompts}"
        out.append((prompts.pop(), batch.rewards[rows].tolist()))
    return out


def test_drops_exactly_the_zero_variance_groups_and_refills_to_the_batch_size():
    draw = Rounds(
        scored([0, 1, 2, 3], [[5, 5], [5, -5], [-5, -5], [-5, 5]]),
        scored([4, 5, 6, 7], [[5, -5], [-5, -5], [5, 5], [-5, 5]]),
        scored([8, 9, 10, 11], [[5, -5]] * 4),  # never drawn: the batch is full after two rounds
    )
    batch, metrics = fill_batch(draw, 4, ON)
    assert draw.calls == [0, 1]
    assert groups_of(batch) == [("1", [5, -5]), ("3", [-5, 5]), ("4", [5, -5]), ("7", [-5, 5])]
    assert batch.group_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert metrics == {
        "dynamic_sampling/rounds": 2.0,
        "dynamic_sampling/prompts_drawn": 8.0,
        "dynamic_sampling/groups_kept": 4.0,
        "dynamic_sampling/groups_dropped": 4.0,
        "dynamic_sampling/groups_surplus": 0.0,
        "dynamic_sampling/groups_filled": 0.0,
        "dynamic_sampling/cap_hit": 0.0,
    }
    # The rounds ran one after the other: their counts and times add up.
    assert batch.extras == {"reward/timeouts": 2.0, "time/routing_record": 1.0}


def test_surplus_groups_of_the_last_round_are_cut_in_draw_order():
    draw = Rounds(
        scored([0, 1, 2], [[1, 0], [1, 1], [0, 0]]),
        scored([3, 4, 5], [[0, 1], [1, 0], [0, 1]]),
    )
    batch, metrics = fill_batch(draw, 3, ON)
    assert [prompt for prompt, _ in groups_of(batch)] == ["0", "3", "4"]
    assert metrics["dynamic_sampling/groups_surplus"] == 1.0
    assert metrics["dynamic_sampling/groups_dropped"] == 2.0


def test_stops_at_the_cap_and_makes_the_batch_up_with_dropped_groups():
    flat = [[1, 1], [0, 0]]
    draw = Rounds(
        scored([0, 1], flat),
        scored([2, 3], [[1, 0], [0, 0]]),
        scored([4, 5], flat),
        scored([6, 7], [[1, 0], [0, 1]]),  # would fill the batch, but is past the cap
    )
    batch, metrics = fill_batch(draw, 2, replace(ON, max_gen_rounds=3))
    assert draw.calls == [0, 1, 2]
    # What it has: the one group with signal, then the first dropped group drawn.
    assert groups_of(batch) == [("2", [1, 0]), ("0", [1, 1])]
    assert metrics["dynamic_sampling/cap_hit"] == 1.0
    assert metrics["dynamic_sampling/groups_kept"] == 1.0
    assert metrics["dynamic_sampling/groups_filled"] == 1.0
    assert metrics["dynamic_sampling/groups_dropped"] == 4.0
    assert metrics["dynamic_sampling/rounds"] == 3.0


def test_the_accuracy_metric_drops_groups_the_length_penalty_spreads():
    # All correct, but an overlong penalty made their rewards differ.
    draw = Rounds(scored([0, 1], [[5.0, 4.2], [5.0, -5.0]], correct=[[True, True], [True, False]]))
    _, by_reward = fill_batch(draw, 2, replace(ON, max_gen_rounds=1))
    batch, by_accuracy = fill_batch(draw, 2, replace(ON, metric="accuracy", max_gen_rounds=1))
    assert by_reward["dynamic_sampling/groups_kept"] == 2.0
    assert by_accuracy["dynamic_sampling/groups_kept"] == 1.0
    assert [prompt for prompt, _ in groups_of(batch)] == ["1", "0"]  # kept first, then the filler


def test_off_is_one_round_returned_as_it_is():
    draw = Rounds(scored([0, 1], [[1, 1], [0, 0]]))
    batch, metrics = fill_batch(draw, 2, DynamicSamplingConfig(enable=False))
    assert batch is draw.rounds[0] and metrics == {} and draw.calls == [0]


# --- through the runner: the loader, the round seeds, resume --------------------------------------

GROUP = 2


class SeededRollout:
    """Responses depend on (prompt, seed): a prompt's group is all-wrong for some seeds only."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], int]] = []

    def generate(self, prompts, n, sampling, seed, keep_groups=None):
        assert n == GROUP and keep_groups is None
        self.calls.append((list(prompts), seed))
        batch = scored(list(prompts), [[0.0] * n for _ in prompts])
        texts = [f"{p}:{(p * 7 + seed) % 3}:{j}" for p in prompts for j in range(n)]
        return replace(batch, response_text=texts, rewards=None, correct=None, extras={})


class TextReward:
    """Right when the text's middle field is 0; a group's answers differ only when its last one is."""

    def score(self, batch):
        right = [
            t.split(":")[1] == "0" or (t.split(":")[1] == "1" and t.endswith(f":{GROUP - 1}"))
            for t in batch.response_text
        ]
        correct = torch.tensor(right)
        return replace(
            batch, rewards=correct.float() * 2 - 1, correct=correct, extras={"reward/timeouts": 0.0}
        )


class RecordingActor:
    def __init__(self) -> None:
        self.trained: list[RolloutBatch] = []

    def compute_logprobs(self, batch):
        return replace(batch, old_logprobs=batch.rollout_logprobs)

    def train(self, batch, step):
        self.trained.append(batch)
        return {}


def make_runner(tmp_path, overrides=()):
    cfg = load_config(
        "tiny-moe-grpo-cpu",
        [
            "data.rollout_batch_size=4",
            f"algorithm.group_size={GROUP}",
            "actor.global_batch_size=8",
            "actor.micro_batch_size=8",
            "algorithm.dynamic_sampling.enable=true",
            "algorithm.dynamic_sampling.max_gen_rounds=5",
            f"runner.output_dir={tmp_path / 'results'}",
            *overrides,
        ],
    )
    rollout, actor = SeededRollout(), RecordingActor()
    roles = Roles(actor=actor, rollout=rollout, reward=TextReward(), colocated=False)  # type: ignore[arg-type]
    runner = grpo_runner.GRPORunner(cfg, roles, list(range(64)), None, MetricLogger(tmp_path / "logs", ()))
    return runner, rollout, actor


def run_steps(runner, steps: int) -> list[dict[str, float]]:
    out = []
    for _ in range(steps):
        runner.step += 1
        out.append(runner.train_step())
    return out


@pytest.fixture(autouse=True)
def _no_weight_sync(monkeypatch):
    monkeypatch.setattr(grpo_runner, "sync_weights", lambda roles, bucket_mb: None)


def test_the_runner_refills_from_the_one_loader_with_a_seed_per_round(tmp_path):
    runner, rollout, actor = make_runner(tmp_path)
    metrics = run_steps(runner, 3)
    drawn = [p for prompts, _ in rollout.calls for p in prompts]
    order = runner.loader._epoch_order().tolist()  # epoch 0 of 64 prompts, 4 per round: no roll-over
    assert drawn == order[: len(drawn)], (
        "every round draws the loader's next prompts, none skipped or repeated"
    )
    assert runner.loader.index == len(drawn)
    assert sum(m["dynamic_sampling/prompts_drawn"] for m in metrics) == len(drawn)
    assert any(m["dynamic_sampling/rounds"] > 1 for m in metrics), "the fake data should need refills"
    seeds = [seed for _, seed in rollout.calls]
    assert len(set(seeds)) == len(seeds), "every round samples with its own seed"
    for batch, m in zip(actor.trained, metrics, strict=True):
        assert len(batch) == 4 * GROUP and len(set(batch.group_index.tolist())) == 4
        assert m["dynamic_sampling/cap_hit"] == 0.0
        assert m["advantages/nonzero_fraction"] == 1.0 and m["advantages/zero_std_groups"] == 0.0


def test_a_resumed_run_draws_the_same_prompts(tmp_path):
    original, original_rollout, original_actor = make_runner(tmp_path / "a")
    run_steps(original, 2)
    saved = json.loads(json.dumps(original.loader.state_dict()))  # as the checkpoint writes it
    calls_before = len(original_rollout.calls)
    run_steps(original, 2)

    resumed, resumed_rollout, resumed_actor = make_runner(tmp_path / "b")
    resumed.loader.load_state_dict(saved)
    resumed.step = 2
    run_steps(resumed, 2)
    assert resumed_rollout.calls == original_rollout.calls[calls_before:]
    assert [b.solutions for b in resumed_actor.trained] == [b.solutions for b in original_actor.trained[2:]]


def test_the_runner_reports_the_cap(tmp_path):
    runner, rollout, actor = make_runner(tmp_path, ["algorithm.dynamic_sampling.max_gen_rounds=1"])
    metrics = run_steps(runner, 4)
    assert all(len(calls) == 4 for calls, _ in rollout.calls) and len(rollout.calls) == 4
    assert any(m["dynamic_sampling/cap_hit"] == 1.0 for m in metrics)
    for batch, m in zip(actor.trained, metrics, strict=True):
        assert len(batch) == 4 * GROUP  # made up to the batch size
        assert m["advantages/nonzero_fraction"] == m["dynamic_sampling/groups_kept"] / 4
