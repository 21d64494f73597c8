"""Procedural arithmetic word problems: the task the tiny CPU model learns end to end.

A problem chains `steps` binary operations left to right, e.g. `Compute 12 + 7 - 3.`, with the
worked solution `12 + 7 = 19. 19 - 3 = 16. The answer is \\boxed{16}.` and the answer `16`. Where a
`*` follows a `+` or `-` the left part is parenthesised, so that the usual precedence rules give
the same value as the left-to-right chain and the written problem is never ambiguous.

Train and val are disjoint by construction: a stable hash of the expression text decides which
split an expression belongs to, whatever the seeds or counts.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlinf.data.records import MathRecord

Split = Literal["train", "val"]

PROMPT_TEMPLATES = ("Compute {}.", "What is {}?", "Evaluate {}.")
ANSWER_TEMPLATE = "The answer is \\boxed{{{}}}."
OPERATIONS = ("+", "-", "*")

# Every character a prompt or worked solution can contain. The tiny model's tokenizer is built from
# this string, so changing it changes that vocabulary (and invalidates tiny checkpoints).
SYNTHETIC_CHARSET = " ()*+-.0123456789=?CETW\\abdehilmnoprstuvwx{}"

# One expression in VAL_SHARE (by hash) belongs to val; the others to train.
VAL_SHARE = 10

# A `*` takes a one-digit right operand so that products stay small.
_MULTIPLIER_RANGE = 10


@dataclass(frozen=True)
class ArithmeticProblem:
    record: MathRecord  # the RL view: prompt text and the answer, as a file record would be
    worked_solution: str  # step-by-step text for the supervised warm start


def generate_arithmetic(
    split: Split,
    num: int,
    *,
    digits: int,
    operations: Sequence[str],
    steps: int,
    seed: int,
) -> list[ArithmeticProblem]:
    """`num` distinct problems of `split`, the same list for the same arguments."""
    _check_arguments(split, num, digits, operations, steps)
    operand_range = 10**digits
    split_capacity = _expression_count(operand_range, operations, steps) * (
        1 / VAL_SHARE if split == "val" else 1 - 1 / VAL_SHARE
    )
    if num > split_capacity:
        raise ValueError(_too_small_message(split, num, split_capacity))
    rng = random.Random(f"arithmetic:{split}:{seed}")
    problems: list[ArithmeticProblem] = []
    seen: set[str] = set()
    max_draws = 100 * num + 10_000  # generous: rejection only struggles when num nears the capacity
    for _ in range(max_draws):
        if len(problems) == num:
            break
        operands = [rng.randrange(operand_range)]
        chosen_ops = []
        for _ in range(steps):
            op = rng.choice(operations)
            chosen_ops.append(op)
            operands.append(rng.randrange(_MULTIPLIER_RANGE if op == "*" else operand_range))
        expression = _expression_text(operands, chosen_ops)
        if expression in seen or _split_of(expression) != split:
            continue
        seen.add(expression)
        template = rng.choice(PROMPT_TEMPLATES)
        answer, worked_solution = _solve(operands, chosen_ops)
        record = MathRecord(
            prompt=template.format(expression),
            solutions=(str(answer),),
            source=f"synthetic:{split}:{len(problems)}",
        )
        problems.append(ArithmeticProblem(record=record, worked_solution=worked_solution))
    if len(problems) < num:
        raise ValueError(_too_small_message(split, num, split_capacity, found=len(problems)))
    return problems


def write_jsonl(problems: Sequence[ArithmeticProblem], path: str | Path) -> None:
    """Write the problems in the AReaL-boba file shape, so they can go through the file loader."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for problem in problems:
            line = {"prompt": problem.record.prompt, "solutions": list(problem.record.solutions)}
            out.write(json.dumps(line) + "\n")


def _check_arguments(split: str, num: int, digits: int, operations: Sequence[str], steps: int) -> None:
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not operations:
        raise ValueError(f"operations must name at least one of {OPERATIONS}")
    unknown = [op for op in operations if op not in OPERATIONS]
    if unknown:
        raise ValueError(f"unknown operation(s) {unknown}; choose from {OPERATIONS}")


def _expression_text(operands: list[int], ops: list[str]) -> str:
    text = str(operands[0])
    has_additive = False
    for op, operand in zip(ops, operands[1:], strict=True):
        if op == "*" and has_additive:
            text = f"({text})"
            has_additive = False
        has_additive = has_additive or op in "+-"
        text = f"{text} {op} {operand}"
    return text


def _solve(operands: list[int], ops: list[str]) -> tuple[int, str]:
    value = operands[0]
    sentences = []
    for op, operand in zip(ops, operands[1:], strict=True):
        result = value + operand if op == "+" else value - operand if op == "-" else value * operand
        sentences.append(f"{value} {op} {operand} = {result}.")
        value = result
    sentences.append(ANSWER_TEMPLATE.format(value))
    return value, " ".join(sentences)


def _split_of(expression: str) -> Split:
    # hashlib, not hash(): Python salts str hashes per process, which would move expressions
    # between splits from one run to the next.
    digest = hashlib.blake2b(expression.encode("ascii"), digest_size=8).digest()
    return "val" if int.from_bytes(digest, "big") % VAL_SHARE == 0 else "train"


def _expression_count(operand_range: int, operations: Sequence[str], steps: int) -> int:
    choices_per_step = sum(_MULTIPLIER_RANGE if op == "*" else operand_range for op in set(operations))
    return operand_range * choices_per_step**steps


def _too_small_message(split: str, num: int, capacity: float, found: int | None = None) -> str:
    found_text = "" if found is None else f"found only {found}; "
    return (
        f"cannot generate {num} distinct {split} problems: {found_text}the {split} split holds about "
        f"{int(capacity)} expressions; raise digits, steps or the number of operations, or lower the count"
    )
