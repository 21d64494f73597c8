"""A step's batch from one or more generation rounds (`algorithm.dynamic_sampling`, DAPO).

Without dynamic sampling a step is one round: its generated, scored groups are the batch. With it,
the groups without signal (rlinf.algorithms.group_filter) are dropped and further rounds draw fresh
prompts until `groups` groups with signal are in hand, or `max_gen_rounds` rounds have run.

The batch is always exactly `groups` whole groups, as without dynamic sampling:
- surplus groups with signal from the last round are cut (in draw order, as verl and NeMo-RL
  truncate to the train batch size);
- a step that reaches the cap short of groups trains on what it has, its groups with signal, and
  makes the batch up with dropped groups (zero advantage, as they would have been trained without
  dynamic sampling). The batch then still splits into actor.global_batch_size minibatches and over
  the data-parallel ranks, and the LR schedule's optimizer steps per step do not change.
  `dynamic_sampling/cap_hit` says so.

Every round draws from the run's one prompt loader, so the loader's position (saved with each
checkpoint) counts every prompt a step drew, refills included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from rlinf.algorithms.group_filter import rows_with_signal
from rlinf.config.schema import DynamicSamplingConfig
from rlinf.data.batch import RolloutBatch
from rlinf.data.metrics_merge import merge_metrics


@dataclass(frozen=True)
class Round:
    batch: RolloutBatch  # generated and scored
    prompts: int  # drawn from the data for it


def fill_batch(
    draw: Callable[[int], Round], groups: int, settings: DynamicSamplingConfig
) -> tuple[RolloutBatch, dict[str, float]]:
    """The step's batch of `groups` groups from rounds `draw(0)`, `draw(1)`, ..., and its
    dynamic_sampling/* metrics (none when dynamic sampling is off)."""
    if not settings.enable:
        return draw(0).batch, {}
    rounds: list[Round] = []
    signal_groups: list[tuple[int, int]] = []  # (round, group id) in draw order
    silent_groups: list[tuple[int, int]] = []
    while len(rounds) < settings.max_gen_rounds and len(signal_groups) < groups:
        drawn = draw(len(rounds))
        batch = drawn.batch
        assert batch.rewards is not None and batch.correct is not None, "a round's batch must be scored"
        signal = rows_with_signal(settings.metric, batch.rewards, batch.correct, batch.group_index)
        for group, has_signal in dict.fromkeys(zip(batch.group_index.tolist(), signal.tolist(), strict=True)):
            (signal_groups if has_signal else silent_groups).append((len(rounds), group))
        rounds.append(drawn)
    kept = signal_groups[:groups]
    filler = silent_groups[: groups - len(kept)]
    parts = [_groups_of(r.batch, i, kept) for i, r in enumerate(rounds)]
    parts += [_groups_of(r.batch, i, filler) for i, r in enumerate(rounds)]
    batch = RolloutBatch.concat([p for p in parts if len(p)])
    batch = replace(batch, extras=_sequential_extras(rounds))
    metrics = {
        "dynamic_sampling/rounds": float(len(rounds)),
        "dynamic_sampling/prompts_drawn": float(sum(r.prompts for r in rounds)),
        "dynamic_sampling/groups_kept": float(len(kept)),
        "dynamic_sampling/groups_dropped": float(len(silent_groups) - len(filler)),
        "dynamic_sampling/groups_surplus": float(len(signal_groups) - len(kept)),
        "dynamic_sampling/groups_filled": float(len(filler)),
        "dynamic_sampling/cap_hit": float(len(kept) < groups),
    }
    return batch, metrics


def _groups_of(batch: RolloutBatch, round_index: int, picked: list[tuple[int, int]]) -> RolloutBatch:
    wanted = {group for r, group in picked if r == round_index}
    return batch.select([row for row, g in enumerate(batch.group_index.tolist()) if g in wanted])


def _sequential_extras(rounds: list[Round]) -> dict[str, float]:
    """The rounds' per-step scalars as one step's: counts add up, and so do times (the rounds ran
    one after another), other values are token-weighted means."""
    extras = [r.batch.extras for r in rounds]
    merged = merge_metrics(extras, [float(r.batch.num_response_tokens) for r in rounds])
    for name in merged:
        if name.startswith("time/"):
            merged[name] = sum(e.get(name, 0.0) for e in extras)
    return merged
