"""Throughput and label agreement of the math grader on ~8000 MATH-style answers.

Pairs come from templates of common answer forms filled with seeded random numbers, each
with a right rewrite or a wrong variant and its label. Prints one JSON object.

    python -m benchmarks.grader_throughput [--items 8000] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

from rlinf.rewards.grader_pool import MathReward
from rlinf.rewards.math_grader import grade

FILLER = "Let us work through the problem step by step. " * 6


def _reduced(num: int, den: int) -> tuple[int, int]:
    g = math.gcd(num, den)
    return num // g, den // g


def _cases(rng: random.Random) -> list[tuple[str, str, bool]]:
    """One (boxed prediction, gold answer, is_right) per answer form, with fresh numbers."""
    a, b = rng.randint(2, 60), rng.randint(2, 60)
    n, d = _reduced(rng.randint(1, 40), rng.choice([3, 7, 9, 11, 13]))
    if d == 1:
        d = 3 if n % 3 else 7
    t_num, t_den = _reduced(rng.randint(1, 99), rng.choice([2, 4, 5, 8, 20, 25]))
    sf = rng.choice([2, 3, 5, 6, 7, 10, 11])
    lo, hi = -a, b
    big = rng.randint(1000, 999999)
    cents = rng.randint(1, 99)
    letter = rng.choice("ABCDE")
    other = rng.choice([c for c in "ABCDE" if c != letter])
    return [
        (f"{a}", f"{a}", True),
        (f"x = {a}", f"{a}", True),
        (f"{a}\\text{{ cm}}", f"{a}", True),
        (f"{a + 1}", f"{a}", False),
        (f"{-a}", f"{a}", False),
        (f"{a * 100}", f"{a}", False),
        (f"\\dfrac{{{n}}}{{{d}}}", f"\\frac{{{n}}}{{{d}}}", True),
        (f"\\frac{{{2 * n}}}{{{2 * d}}}", f"\\frac{{{n}}}{{{d}}}", True),
        (f"\\frac{{{d}}}{{{n}}}", f"\\frac{{{n}}}{{{d}}}", n == d),
        (f"{n / d:.4f}", f"\\frac{{{n}}}{{{d}}}", False),
        (f"{t_num / t_den:g}", f"\\frac{{{t_num}}}{{{t_den}}}", True),
        (f"\\sqrt{{{a * a * sf}}}", f"{a}\\sqrt{{{sf}}}", True),
        (f"{a} \\sqrt{{ {sf} }}", f"{a}\\sqrt{{{sf}}}", True),
        (f"{sf}\\sqrt{{{a}}}", f"{a}\\sqrt{{{sf}}}", sf == a),
        (f"{a * math.sqrt(sf):.3f}", f"{a}\\sqrt{{{sf}}}", False),
        (f"\\frac{{{a}}}{{{b}}}\\sqrt{{{sf}}}", f"\\frac{{{a}\\sqrt{{{sf}}}}}{{{b}}}", True),
        (f"\\left({a}, -{b}\\right)", f"({a},-{b})", True),
        (f"(-{b}, {a})", f"({a},-{b})", False),
        (f"({a})", f"({a},-{b})", False),
        (f"\\left[{lo}, {hi}\\right)", f"[{lo},{hi})", True),
        (f"[{lo}, {hi}]", f"[{lo},{hi})", False),
        (f"(x+{a})(x+{b})", f"x^2+{a + b}x+{a * b}", True),
        (f"(x+{a})(x-{b})", f"x^2+{a + b}x+{a * b}", False),
        (f"{a}\\%", f"{a}", True),
        (f"{a / 100:g}", f"{a}\\%", False),
        (f"{a}.{cents:02d}", f"\\${a}.{cents:02d}", True),
        (f"{a}.{(cents + 1) % 100:02d}", f"\\${a}.{cents:02d}", False),
        (f"{big:,}".replace(",", ",\\!"), f"{big}", True),
        (f"{big + 10}", f"{big:,}", False),
        (f"\\text{{({letter})}}", f"\\text{{({letter})}}", True),
        (f"{letter}", f"\\text{{({letter})}}", True),
        (f"({other})", f"\\text{{({letter})}}", False),
        (f"{a}\\pi", f"{a}\\pi", True),
        (f"{a * 3.1416:.4f}", f"{a}\\pi", False),
        (f"\\{{{b}, {a + b}\\}}", f"\\{{{a + b},{b}\\}}", True),
        (f"\\{{{b}\\}}", f"\\{{{a + b},{b}\\}}", False),
        (
            f"\\begin{{pmatrix}} {a} \\\\ {b} \\end{{pmatrix}}",
            f"\\begin{{pmatrix}}{a}\\\\{b}\\end{{pmatrix}}",
            True,
        ),
        (
            f"\\begin{{pmatrix}} {b} \\\\ {a} \\end{{pmatrix}}",
            f"\\begin{{pmatrix}}{a}\\\\{b}\\end{{pmatrix}}",
            a == b,
        ),
        (f"{a}^\\circ", f"{a}", True),
        (f"{a}", f"{a}^{{\\circ}}", True),
        (f"\\pm {a}", f"{a},-{a}", True),
        (f"{a}", f"\\pm {a}", False),
    ]


def build_items(count: int, seed: int = 0) -> tuple[list[str], list[list[str]], list[bool]]:
    rng = random.Random(seed)
    responses, solutions, labels = [], [], []
    while len(responses) < count:
        for pred, gold, label in _cases(rng):
            style = rng.random()
            if style < 0.05:  # no box at all: always wrong
                response, label = f"{FILLER}The answer is {pred}.", False
            elif style < 0.15:  # a worked solution as the reference, and an earlier box
                response = f"First guess \\boxed{{0}}. {FILLER}So the answer is $\\boxed{{{pred}}}$."
                gold = f"{FILLER}Therefore the answer is $\\boxed{{{gold}}}$."
            else:
                response = f"{FILLER}The final answer is $\\boxed{{{pred}}}$."
            responses.append(response)
            solutions.append([gold])
            labels.append(label)
    return responses[:count], solutions[:count], labels[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    responses, solutions, labels = build_items(args.items)

    start = time.perf_counter()
    serial = [grade(r, s) for r, s in zip(responses, solutions, strict=True)]
    seconds_serial = time.perf_counter() - start

    with MathReward(num_workers=args.workers) as reward:
        reward.score(["\\boxed{1}"] * args.workers, [["1"]] * args.workers)  # wait for workers to start
        start = time.perf_counter()
        result = reward.score(responses, solutions)
        seconds_pool = time.perf_counter() - start

    agree = sum(c == label for c, label in zip(result.correct, labels, strict=True))
    wrong_labels = [i for i, label in enumerate(labels) if not label]
    false_positives = sum(result.correct[i] for i in wrong_labels)
    print(
        json.dumps(
            {
                "items": len(responses),
                "seconds_pool": round(seconds_pool, 2),
                "items_per_s_pool": round(len(responses) / seconds_pool, 1),
                "seconds_serial": round(seconds_serial, 2),
                "accuracy_vs_labels": round(agree / len(labels), 5),
                "false_positive_rate": round(false_positives / max(1, len(wrong_labels)), 5),
                "pool_matches_serial": serial == result.correct,
                "timeouts": result.timeouts,
                "workers": args.workers,
            }
        )
    )


if __name__ == "__main__":
    main()
