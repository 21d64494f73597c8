from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlinf.data.records import MathRecord, load_math_records
from rlinf.data.synthetic import (
    ANSWER_TEMPLATE,
    PROMPT_TEMPLATES,
    SYNTHETIC_CHARSET,
    ArithmeticProblem,
    generate_arithmetic,
    write_jsonl,
)

PROMPT_PATTERN = re.compile(r"^(?:Compute (?P<a>.+)\.|What is (?P<b>.+)\?|Evaluate (?P<c>.+)\.)$")
STEP_PATTERN = re.compile(r"^(-?\d+) ([-+*]) (\d+) = (-?\d+)\.$")


def expression_of(problem: ArithmeticProblem) -> str:
    match = PROMPT_PATTERN.match(str(problem.record.prompt))
    assert match is not None, problem.record.prompt
    return next(group for group in match.groups() if group is not None)


def generate(split: str = "train", num: int = 300, **overrides: object) -> list[ArithmeticProblem]:
    knobs: dict = {"digits": 2, "operations": ("+", "-", "*"), "steps": 3, "seed": 0} | overrides
    return generate_arithmetic(split, num, **knobs)  # type: ignore[arg-type]


def test_example_shape() -> None:
    problem = generate(num=1, digits=2, operations=("+", "-"), steps=2, seed=5)[0]
    expression = expression_of(problem)
    assert re.fullmatch(r"\d{1,2} [-+] \d{1,2} [-+] \d{1,2}", expression)
    assert problem.record.source == "synthetic:train:0"
    assert problem.worked_solution.endswith(f"The answer is \\boxed{{{problem.record.solutions[0]}}}.")


def test_answers_follow_usual_precedence_and_worked_steps_are_right() -> None:
    problems = generate(num=500)
    for problem in problems:
        expression = expression_of(problem)
        # Python's own precedence: the parentheses must make the written problem mean the chain.
        answer = eval(expression)  # the text holds only digits, spaces, + - * and parentheses
        assert problem.record.solutions == (str(answer),)
        *steps, final = problem.worked_solution.split(". ")
        assert final == ANSWER_TEMPLATE.format(answer)
        assert len(steps) == 3 == len(re.findall(r" [-+*] ", expression))
        previous = None
        for step in steps:
            left, op, right, result = STEP_PATTERN.match(step + ".").groups()  # type: ignore[union-attr]
            assert int(result) == eval(f"{left} {op} {right}")
            assert previous is None or left == previous  # chained left to right
            assert len(right) == 1 if op == "*" else len(right) <= 2
            previous = result
        assert previous == str(answer)
    assert any(answer.startswith("-") for p in problems for answer in p.record.solutions)
    assert any("(" in expression_of(p) for p in problems)


def test_same_seed_same_problems_and_other_seed_other_problems() -> None:
    assert generate(seed=3) == generate(seed=3)
    assert [p.record.prompt for p in generate(seed=3)] != [p.record.prompt for p in generate(seed=4)]
    assert all(p.record.source == f"synthetic:train:{i}" for i, p in enumerate(generate(seed=3)))


def test_splits_are_disjoint_whatever_the_seeds_and_problems_are_unique() -> None:
    small_space = {"digits": 1, "operations": ("+", "-"), "steps": 2}  # 10 * 20**2 = 4000 expressions
    train = {expression_of(p) for seed in (0, 1) for p in generate("train", 1500, seed=seed, **small_space)}
    val = [expression_of(p) for seed in (0, 1) for p in generate("val", 150, seed=seed, **small_space)]
    assert len(set(val)) > 150  # the two val draws are different samples of the val split
    assert train.isdisjoint(val)
    once = [expression_of(p) for p in generate("val", 150, seed=0, **small_space)]
    assert len(set(once)) == 150


def test_every_character_is_in_the_documented_charset() -> None:
    problems = generate(num=2000, operations=("+", "-", "*"), steps=4, digits=3)
    text = "".join(str(p.record.prompt) + p.worked_solution for p in problems)
    assert set(text) <= set(SYNTHETIC_CHARSET)
    assert set("".join(PROMPT_TEMPLATES) + ANSWER_TEMPLATE) - set("{}") <= set(SYNTHETIC_CHARSET)
    assert set(SYNTHETIC_CHARSET) <= set(text)  # nothing in the vocabulary that never occurs
    assert SYNTHETIC_CHARSET.isascii()


def test_too_small_a_space_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="cannot generate 200 distinct train problems"):
        generate("train", 200, digits=1, operations=("+",), steps=1)  # only 100 expressions exist


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"operations": ("/",)}, "unknown operation"),
        ({"operations": ()}, "at least one"),
        ({"digits": 0}, "digits must be >= 1"),
        ({"steps": 0}, "steps must be >= 1"),
    ],
)
def test_bad_knobs_are_refused(overrides: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        generate(num=1, **overrides)


def test_jsonl_round_trip_through_the_file_loader(tmp_path: Path) -> None:
    problems = generate("val", 20)
    path = tmp_path / "synthetic" / "val.jsonl"
    write_jsonl(problems, path)
    loaded = load_math_records([str(path)])
    assert loaded.records == [
        MathRecord(p.record.prompt, p.record.solutions, f"{path}:{i}")
        for i, p in enumerate(problems, start=1)
    ]
