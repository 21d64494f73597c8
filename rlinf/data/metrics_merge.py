"""How per-rank (or per-engine) metrics combine into one value per name.

The rule is read off the metric's name, first match wins:

| name                                              | merge                         |
| ------------------------------------------------- | ----------------------------- |
| listed in `SUMMED` / ends in `_max` / `_min`      | sum / max / min               |
| starts with `time/`                               | max (the slowest rank decides) |
| last segment starts with `num_` or ends in `_count` | sum (a count)               |
| anything else                                     | mean weighted by each rank's response tokens |

Actor training metrics are not merged this way: they are already all-reduced inside the update
(rlinf.workers.actor.policy_update), so every rank returns the global values and the actor facade
takes one reporting rank's dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# Counts whose names have no count suffix.
SUMMED = frozenset({"reward/timeouts", "actor/skipped_steps", "actor/early_stopped_minibatches"})


def merge_rule(name: str) -> str:
    last = name.rsplit("/", 1)[-1]
    if name in SUMMED:
        return "sum"
    if name.endswith("_max"):
        return "max"
    if name.endswith("_min"):
        return "min"
    if name.startswith("time/"):
        return "max"
    if last.startswith("num_") or last.endswith("_count"):
        return "sum"
    return "mean"


def merge_metrics(per_rank: Sequence[Mapping[str, float]], weights: Sequence[float]) -> dict[str, float]:
    """One dict from each rank's, `weights[i]` = rank i's response tokens (used by weighted means).

    A name missing on some ranks merges over the ranks that have it; with all weights zero the
    mean is unweighted.
    """
    if len(per_rank) != len(weights):
        raise ValueError(f"{len(per_rank)} metric dicts but {len(weights)} weights")
    names = list(dict.fromkeys(name for metrics in per_rank for name in metrics))
    merged: dict[str, float] = {}
    for name in names:
        pairs = [(float(m[name]), float(w)) for m, w in zip(per_rank, weights, strict=True) if name in m]
        values = [v for v, _ in pairs]
        rule = merge_rule(name)
        if rule == "sum":
            merged[name] = sum(values)
        elif rule == "max":
            merged[name] = max(values)
        elif rule == "min":
            merged[name] = min(values)
        else:
            total = sum(w for _, w in pairs)
            merged[name] = sum(v * w for v, w in pairs) / total if total > 0 else sum(values) / len(values)
    return merged
