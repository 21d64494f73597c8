"""Predicted step time and gain of the Moonlight recipe on one 8-GPU node, placement by placement:
colocated (bound 0) against rollout and actor on GPUs of their own (bound 0, and bound 1 =
runner.max_staleness 1), from the phase times of a measured colocated step and the memory plan.
Predictions, not measurements; the rules are benchmarks/step_time_model.py's.

    python -m benchmarks.overlap_prediction --hf-config tests/fixtures/moonlight-16b-a3b-config.json \
        [--measured docs/data/colocated_step_2026-12-04.jsonl] [--phase rollout=120 ...]

The measured phase seconds (the last row of --measured with `phase_seconds`, as
benchmarks/grpo_step_runner.py writes it; --phase replaces one, e.g. with an 8-GPU run's time/*
metrics) are taken as those of the recipe as shipped, placement #1: 8 GPUs colocated, SGLang TP=8,
the actor offloaded between phases. Every placement is the recipe with its overrides, loaded and
validated as a run would be (a refused one is listed with its config error). A second table repeats
the gains with the generate stretched to larger shares of the step (longer responses).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NamedTuple

from benchmarks.step_time_model import Layout, Phases, fits, layout, predict_layout, with_rollout_share
from rlinf.models.memory_plan import GIB, GPU_BYTES

RECIPE = "moonlight-16b-grpo-megatron"
MEASURED = Path(__file__).resolve().parents[1] / "docs/data/colocated_step_2026-12-04.jsonl"
SPLIT_ROLLOUT_MEMORY = 0.85  # SGLang's share on GPUs of its own (the recipe's 0.5 leaves room for the actor)


class Placement(NamedTuple):
    name: str
    bound: int  # runner.max_staleness
    overrides: tuple[str, ...]


def split(rollout: int, actor_tp: int, rollout_tp: int) -> tuple[str, ...]:
    """The recipe's overrides for `rollout` GPUs of rollout and the other 8 - rollout of actor."""
    return (
        "~cluster.component_placement",
        f'+cluster.component_placement={{rollout:"0-{rollout - 1}",actor:"{rollout}-7",reward:all}}',
        f"actor.model.tensor_model_parallel_size={actor_tp}",
        f"actor.model.expert_model_parallel_size={actor_tp}",
        f"rollout.tensor_parallel_size={rollout_tp}",
        f"rollout.gpu_memory_utilization={SPLIT_ROLLOUT_MEMORY}",
        "actor.offload_between_phases=false",
    )


RESIDENT = ("actor.offload_between_phases=false",)
PLACEMENTS = [
    Placement("8 colocated, offloaded (reference)", 0, ("actor.offload_between_phases=true",)),
    Placement("8 colocated, resident", 0, RESIDENT),
    Placement("8 colocated, resident", 0, (*RESIDENT, "rollout.tensor_parallel_size=2")),
    Placement("4 rollout + 4 actor", 0, split(4, actor_tp=4, rollout_tp=4)),
    Placement("4 rollout + 4 actor", 1, split(4, actor_tp=4, rollout_tp=4)),
    Placement("4 rollout + 4 actor", 1, split(4, actor_tp=4, rollout_tp=2)),
    Placement("6 rollout + 2 actor", 1, split(6, actor_tp=2, rollout_tp=2)),
    Placement("2 rollout + 6 actor", 1, split(2, actor_tp=2, rollout_tp=2)),
]


def read_measured(path: str, phase_overrides: list[str]) -> Phases:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    measured = [row["phase_seconds"] for row in rows if "phase_seconds" in row]
    if not measured:
        raise ValueError(f"{path}: no row with phase_seconds (a benchmarks/grpo_step_runner.py summary)")
    seconds = {name: float(measured[-1].get(name, 0.0)) for name in Phases.__dataclass_fields__}
    for item in phase_overrides:
        name, _, value = item.partition("=")
        if name not in seconds:
            raise ValueError(f"--phase {item}: NAME=SECONDS with NAME one of {', '.join(seconds)}")
        try:
            seconds[name] = float(value)
        except ValueError:
            raise ValueError(f"--phase {item}: {value!r} is not a number of seconds") from None
    return Phases(**seconds)


def describe(lay: Layout) -> tuple[str, str]:
    rollout = f"{lay.rollout_gpus}: {lay.engines} x TP={lay.rollout_tp} (batch {lay.running_batch})"
    return rollout, f"{lay.actor_gpus}: {lay.actor_tp} / {lay.actor_ep} / {lay.actor_dp}"


def memory_cell(lay: Layout, gpu_bytes: float) -> str:
    peaks = [lay.peak_rollout] if lay.colocated else [lay.peak_rollout, lay.peak_actor]
    cell = " / ".join(f"{p / GIB:.1f} ({p / gpu_bytes:.0%})" for p in peaks)
    return cell if fits(lay, gpu_bytes) else f"{cell}, **does not fit**"


def report(ref: Phases, hf: dict, gpu: str, nccl_sync_factor: float, shares: list[float]) -> str:
    from rlinf.config import ConfigError, load_config

    gpu_bytes = GPU_BYTES[gpu]
    layouts: list[tuple[int, str, Layout]] = []
    refused = []
    for number, (name, bound, overrides) in enumerate(PLACEMENTS, 1):
        try:
            cfg = load_config(RECIPE, [*overrides, f"runner.max_staleness={bound}"])
            layouts.append((number, name, layout(cfg, hf, gpu_bytes)))
        except (ConfigError, ValueError) as err:
            refused.append(f"- #{number} {name}, bound {bound}: refused by the recipe's checks: {err}")
    base = layouts[0][2]
    lines = [
        f"measured step {ref.step:.2f} s: " + ", ".join(f"{k} {v:g}" for k, v in vars(ref).items()),
        "",
        f"| # | placement ({gpu}) | bound | rollout GPUs: engines x TP (running batch) | actor GPUs: TP / EP / DP "
        "| rollout side s | actor side s | sync + offload + other s | step s | gain | peak GiB per GPU: rollout / actor |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for number, name, lay in layouts:
        p = predict_layout(ref, base, lay, nccl_sync_factor)
        rollout, actor = describe(lay)
        lines.append(
            f"| {number} | {name} | {lay.bound} | {rollout} | {actor} | {p.rollout_side:.2f} | "
            f"{p.actor_side:.2f} | {p.serial:.2f} | {p.step:.2f} | {ref.step / p.step:.2f}x | "
            f"{memory_cell(lay, gpu_bytes)} |"
        )
    lines += ["", *refused] if refused else []
    fitting = [(n, lay) for n, _, lay in layouts if fits(lay, gpu_bytes)]
    lines += [
        "",
        "| gain over #1, generate at this share of its step | "
        + " | ".join(f"#{n}" for n, _ in fitting)
        + " |",
        "| --- |" + " --- |" * len(fitting),
    ]
    for share in [ref.rollout / ref.step, *shares]:
        stretched = with_rollout_share(ref, share)
        gains = [
            stretched.step / predict_layout(stretched, base, lay, nccl_sync_factor).step for _, lay in fitting
        ]
        lines.append(f"| {share:.0%} | " + " | ".join(f"{g:.2f}x" for g in gains) + " |")
    return "\n".join(lines)


def shares_between_0_and_1(text: str) -> list[float]:
    try:
        shares = [float(s) for s in text.split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated numbers expected") from None
    if any(not 0 < s < 1 for s in shares):
        raise argparse.ArgumentTypeError(f"{text!r}: each share must lie between 0 and 1")
    return shares


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-config", required=True, help="the model's config.json")
    parser.add_argument("--measured", default=MEASURED, help="JSONL with a phase_seconds row")
    parser.add_argument(
        "--phase", action="append", default=[], help="NAME=SECONDS: replaces a measured phase"
    )
    parser.add_argument("--gpu", default="H200", choices=list(GPU_BYTES))
    parser.add_argument("--nccl-sync-factor", type=float, default=2.0, help="NCCL sync / measured IPC sync")
    parser.add_argument(
        "--rollout-shares",
        type=shares_between_0_and_1,
        default=[0.5, 0.7, 0.85],
        help="also predict with the generate at these shares of the measured step (comma-separated)",
    )
    args = parser.parse_args(argv)
    try:
        hf = json.loads(Path(args.hf_config).read_text())
        ref = read_measured(args.measured, args.phase)
        print(report(ref, hf, args.gpu, args.nccl_sync_factor, args.rollout_shares))
    except KeyError as err:
        print(
            f"overlap_prediction: {args.hf_config}: no field {err} (not a DeepSeek-V3 config?)",
            file=sys.stderr,
        )
        return 2
    except (OSError, ValueError) as err:
        print(f"overlap_prediction: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
