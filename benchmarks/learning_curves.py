"""Learning curves of several runs in one PNG, and their summary as JSON.

    python -m benchmarks.learning_curves --run torch=logs/a/metrics.jsonl --run megatron=logs/b/metrics.jsonl \
        --out docs/curves.png [--title "..."]

Each run is LABEL=PATH to a run's metrics.jsonl (runner.logger.log_path). The figure has three panels:
greedy validation accuracy, mean training reward, and the rollout-vs-actor logprob mismatch
(`rollout/logprob_abs_diff`). The JSON printed on stdout gives, per run, the validation accuracy at
step 0, at the last validation and at its best, the gain, the mismatch at the start and the end of the
run, and the mean seconds per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def read_rows(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key`, one value per step: the last row that carries it wins (a resumed
    run logs a step again)."""
    by_step: dict[int, float] = {}
    for row in rows:
        if key in row and "step" in row:
            by_step[int(row["step"])] = float(row[key])
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def _mean(values: list[float]) -> float | None:
    return float(f"{statistics.fmean(values):.4g}") if values else None


def summarize(rows: list[dict]) -> dict:
    val_steps, val = series(rows, "val/accuracy")
    _, mismatch = series(rows, "rollout/logprob_abs_diff")
    _, step_s = series(rows, "time/step")
    tenth = max(1, len(mismatch) // 10)
    out: dict = {"steps": max(series(rows, "rollout/reward_mean")[0], default=0)}
    if val:
        out.update(
            val_first_step=val_steps[0],
            val_first=round(val[0], 4),
            val_last_step=val_steps[-1],
            val_last=round(val[-1], 4),
            val_best=round(max(val), 4),
            val_best_step=val_steps[val.index(max(val))],
            gain_points=round(100 * (val[-1] - val[0]), 1),
            last_below_best_points=round(100 * (max(val) - val[-1]), 1),
        )
    out.update(
        logprob_abs_diff_first_tenth=_mean(mismatch[:tenth]),
        logprob_abs_diff_last_tenth=_mean(mismatch[-tenth:]),
        seconds_per_step=_mean(step_s),
    )
    return out


def plot(runs: dict[str, list[dict]], out: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    panels = (
        ("val/accuracy", "greedy validation accuracy", dict(marker="o")),
        ("rollout/reward_mean", "mean training reward", dict(alpha=0.8)),
        ("rollout/logprob_abs_diff", "rollout vs actor |logprob diff| (mean)", dict(alpha=0.8)),
    )
    for ax, (key, label, style) in zip(axes, panels, strict=True):
        for name, rows in runs.items():
            steps, values = series(rows, key)
            if steps:
                ax.plot(steps, values, label=name, **style)
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(0, 1)
    axes[0].legend(loc="lower right")
    if any(series(rows, "rollout/logprob_abs_diff")[1] for rows in runs.values()):
        axes[2].set_yscale("log")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--run", action="append", required=True, metavar="LABEL=PATH", help="a run's metrics.jsonl"
    )
    parser.add_argument("--out", help="PNG to write")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {}
    for spec in args.run:
        label, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            parser.error(f"--run {spec}: expected LABEL=PATH to an existing metrics.jsonl")
        runs[label] = read_rows(path)
    if args.out:
        plot(runs, args.out, args.title)
    print(
        json.dumps(
            {"runs": {label: summarize(rows) for label, rows in runs.items()}, "plot": args.out}, indent=1
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
