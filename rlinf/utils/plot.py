"""PNG of training reward and validation accuracy per step, saved next to the logs."""

from __future__ import annotations

from pathlib import Path


def plot_training_curves(history: list[dict[str, float]], out: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key: str) -> tuple[list[int], list[float]]:
        rows = [(int(r["step"]), r[key]) for r in history if key in r]
        return [s for s, _ in rows], [v for _, v in rows]

    fig, (ax_reward, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    ax_reward.plot(*series("rollout/reward_mean"), label="rollout/reward_mean")
    ax_reward.set_xlabel("step")
    ax_reward.set_ylabel("mean reward")
    ax_reward.set_title("Training reward")
    ax_reward.grid(alpha=0.3)
    ax_acc.plot(*series("rollout/accuracy"), label="rollout/accuracy (sampled)", alpha=0.6)
    ax_acc.plot(*series("val/accuracy"), marker="o", label="val/accuracy (greedy)")
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("accuracy")
    ax_acc.set_ylim(0, 1)
    ax_acc.set_title("Accuracy")
    ax_acc.grid(alpha=0.3)
    ax_acc.legend(loc="lower right")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
