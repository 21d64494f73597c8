"""Tests of rlinf.rewards.math_grader.grade on MATH-style answers (CPU only)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from rlinf.rewards.math_grader import extract_last_boxed, grade
from rlinf.rewards.normalize import normalize_answer


def boxed(answer: str) -> str:
    return f"We simplify step by step. Therefore the answer is $\\boxed{{{answer}}}$."


# (boxed prediction, reference answer): the same answer written differently.
EQUIVALENT = [
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
    ("\\dfrac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}"),
    ("\\tfrac{1}{2}", "\\dfrac12"),
    ("0.5", "\\frac12"),
    ("\\frac{1}{2}", "0.5"),
    ("-0.5", "-\\frac{1}{2}"),
    ("\\frac{-1}{2}", "-\\frac{1}{2}"),
    ("\\frac{2}{4}", "\\frac{1}{2}"),
    ("4\\frac{2}{3}", "\\frac{14}{3}"),
    ("(2, -1)", "(2,-1)"),
    ("\\left( 2, -1 \\right)", "(2,-1)"),
    ("\\left[ -2, 3 \\right)", "[-2,3)"),
    ("(-\\infty, 0) \\cup (1, \\infty)", "(-\\infty,0)\\cup(1,\\infty)"),
    ("\\{2, 1\\}", "\\{1,2\\}"),
    ("2, 1", "1,2"),
    ("(x+1)^2", "x^2+2x+1"),
    ("x(x^2-3)", "x^3-3x"),
    ("\\frac{1}{x}+\\frac{1}{x+1}", "\\frac{2x+1}{x(x+1)}"),
    ("C", "\\text{(C)}"),
    ("\\textbf{(C)}", "\\text{(C)}"),
    ("(C)", "\\text{(C)}"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("2\\sqrt2", "2\\sqrt{2}"),
    ("3\\sqrt{3}", "\\sqrt{27}"),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"),
    ("\\sqrt{2}+\\sqrt{3}", "\\sqrt{3}+\\sqrt{2}"),
    ("10", "10\\%"),
    ("10\\%", "10"),
    ("50\\%", "50"),
    ("90", "90^\\circ"),
    ("90^{\\circ}", "90"),
    ("90\\text{ degrees}", "90"),
    ("18.9", "\\$18.90"),
    ("\\$18.90", "18.90"),
    ("5", "5\\text{ inches}"),
    ("6\\text{ cm}^2", "6"),
    ("6 \\mbox{ cm}^2", "6"),
    ("12\\text{ square units}", "12"),
    ("1000", "1,\\!000"),
    ("1{,}000", "1000"),
    ("1,234,567", "1234567"),
    ("\\$1,000.50", "1000.5"),
    ("\\infty", "\\infty"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("\\begin{bmatrix}1\\\\2\\end{bmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("3", "a=3"),
    ("x = 5", "5"),
    ("f(3) = 7", "7"),
    ("AB = 5", "5"),
    ("\\angle ABC = 30^\\circ", "30"),
    ("y = 2x+3", "y=2x+3"),
    ("5.", "5"),
    ("\\frac{1}{2}.", "\\frac{1}{2}"),
    ("\\pm 2", "2,-2"),
    ("-2, 2", "\\pm 2"),
    ("\\text{Monday}", "\\text{Monday}"),
    ("monday", "\\text{Monday}"),
    ("\\pi r^2", "\\pi r^{2}"),
    ("2 \\pi", "2\\pi"),
    ("1.5\\times10^{3}", "1500"),
    ("2i+3", "3+2i"),
    ("\\log_2 8", "3"),
    ("120", "5!"),
    ("\\binom{5}{2}", "10"),
    ("2^{100}", "1267650600228229401496703205376"),
    ("x \\in [1,2]", "[1,2]"),
]

# (boxed prediction, reference answer): a different answer, which must be graded wrong.
WRONG = [
    ("50", "0.5"),  # off by 100x (percent confusion)
    ("0.5", "50"),
    ("0.5", "50\\%"),
    ("5\\%", "0.5"),
    ("100", "1"),
    ("1.0001", "1"),  # within 1e-4 relative but not equal
    ("1", "1.0001"),
    ("999.9999", "1000"),
    ("3.1416", "\\pi"),  # approximations of exact values
    ("3.14", "\\pi"),
    ("0.333333", "\\frac13"),
    ("0.866025", "\\frac{\\sqrt{3}}{2}"),
    ("1.4142", "\\sqrt2"),
    ("2.718", "e"),
    ("-2", "2"),  # sign errors
    ("2", "-2"),
    ("\\frac{1}{2}", "-\\frac{1}{2}"),
    ("-\\infty", "\\infty"),
    ("\\frac{2}{3}", "\\frac{3}{2}"),  # different fractions
    ("\\frac{1}{3}", "\\frac{1}{4}"),
    ("\\frac{14}{3}", "4\\frac{1}{3}"),
    ("(2)", "(2,-1)"),  # partial or reordered tuples
    ("2", "(2,-1)"),
    ("(2,-1,0)", "(2,-1)"),
    ("(-1,2)", "(2,-1)"),
    ("[-2,3]", "[-2,3)"),  # intervals with other endpoints
    ("(-2,3)", "[-2,3)"),
    ("\\{1,2\\}", "(1,2)"),  # a set is not an ordered pair
    ("\\{1\\}", "\\{1,2\\}"),
    ("1", "1,2"),
    ("1,2,3", "1,2"),
    ("2", "\\pm 2"),
    ("6", "5\\text{ cm}"),  # unit-free values
    ("6\\text{ cm}", "5"),
    ("\\text{(A)}", "\\text{(C)}"),  # other choices
    ("12", "\\text{(C)}"),
    ("\\text{Tuesday}", "\\text{Monday}"),
    ("\\text{even}", "\\text{odd}"),
    ("x^2+2x", "x^2+2x+1"),  # other expressions
    ("(x-1)^2", "x^2+2x+1"),
    ("\\frac{x+1}{x}", "1+x"),
    ("2\\sqrt{3}", "3\\sqrt{2}"),
    ("\\frac{\\pi}{3}", "\\frac{\\pi}{4}"),
    ("\\begin{pmatrix}2\\\\1\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("3+2i", "3-2i"),
    ("y=2x-3", "y=2x+3"),
    ("x = 4", "5"),
    ("-5", "x=5"),
    ("-x = 5", "x=5"),  # an equation whose right side matches is not enough
    ("2x+3 = 5", "5"),
    ("1001", "1000"),
    ("10^{100}+1", "10^{100}"),
    ("1,000", "1,00"),
    ("0", "1"),
]


@pytest.mark.parametrize(("pred", "gold"), EQUIVALENT)
def test_equivalent_forms_are_right(pred, gold):
    assert grade(boxed(pred), [gold])


@pytest.mark.parametrize(("pred", "gold"), WRONG)
def test_different_answers_are_wrong(pred, gold):
    assert not grade(boxed(pred), [gold])


def test_normalised_strings_of_common_forms():
    assert normalize_answer("\\dfrac{1}{2}") == "\\frac{1}{2}"
    assert normalize_answer("1,\\!000") == "1000"
    assert normalize_answer("(1,2)") == "(1,2)"  # a pair, not a thousands number
    assert normalize_answer("\\$18.90.") == "18.90"
    assert normalize_answer("90^{\\circ}") == "90"
    assert normalize_answer("\\pi r") == "\\pi r"  # the space ends the command name


@pytest.mark.parametrize(
    "response",
    [
        "The answer is 5.",
        "The answer is $5$.",
        "\\boxed{}",
        "\\boxed{5",  # unclosed
        "\\boxed{4} but on reflection it is 5",  # unboxed text is never read
        "",
    ],
)
def test_responses_without_a_complete_box_are_wrong(response):
    assert not grade(response, ["5"])


def test_the_last_box_wins():
    assert grade("First \\boxed{4}, then correcting: \\boxed{5}", ["5"])
    assert not grade("First \\boxed{5}, then correcting: \\boxed{4}", ["5"])
    assert not grade("\\boxed{5} and finally \\boxed{", ["5"])  # an unclosed last box is not skipped
    assert grade("\\fbox{4} ... \\fbox{5}", ["5"])
    assert grade("\\boxed{4} ... \\fbox{5}", ["5"])


def test_box_forms_and_nested_braces():
    assert grade("so $\\boxed 5$.", ["5"])
    assert grade("so \\boxed {5}", ["5"])
    assert grade("\\boxed{\\frac{1}{\\sqrt{2}}}", ["\\frac{\\sqrt2}{2}"])
    assert extract_last_boxed("x \\boxed{\\frac{a}{\\sqrt{b^{2}}}} y") == "\\frac{a}{\\sqrt{b^{2}}}"
    assert extract_last_boxed("\\boxedx") is None


def test_solutions_may_be_worked_texts_and_any_may_match():
    solution = "Since $x=3$ fails, \\boxed{3} is ruled out; so the answer is $\\boxed{\\frac{14}{3}}$."
    assert grade(boxed("\\frac{14}{3}"), [solution])
    assert not grade(boxed("3"), [solution])
    assert grade(boxed("7"), ["5", "7"])
    assert not grade(boxed("6"), ["5", "7"])
    assert not grade(boxed("5"), [])
    assert grade(boxed("5"), "5")  # a lone string is one solution, not a list of characters


PATHOLOGICAL = [
    "\\boxed{9^{9^{9^{9^{9}}}}}",
    "\\boxed{9^9^9^9}",
    "\\boxed{10^{10^{10}}}",
    "\\boxed{100000!}",
    "\\boxed{(x+1)^{99999}}",
    "x" * 200_000 + " \\boxed{4}",
    "\\boxed{4}" + " y" * 100_000,
    "\\boxed{" + "{" * 50_000,
    "\\boxed{" + "}" * 5000,
    "\\boxed{" + "{" * 200 + "4" + "}" * 200 + "}",
    "\\boxed{" + "\\sin(" * 50 + "1" + ")" * 50 + "}",
    "\\boxed{" + "+".join(f"x^{{{i}}}" for i in range(300)) + "}",
]


@pytest.mark.parametrize("response", PATHOLOGICAL, ids=lambda r: r[:30])
def test_pathological_answers_are_wrong_in_bounded_time(response):
    start = time.perf_counter()
    assert not grade(response, ["5"])
    assert time.perf_counter() - start < 2.0


# The same kinds of input, with a gold answer that matches: a grader that calls anything long,
# deep or huge "wrong" fails here.
_POLYNOMIAL = "+".join(f"x^{{{i}}}" for i in range(300))
_NESTED_SIN = "\\sin(" * 50 + "1" + ")" * 50
PATHOLOGICAL_BUT_RIGHT = [
    ("\\boxed{9^{9^{9^{9^{9}}}}}", "9^{9^{9^{9^{9}}}}"),
    ("\\boxed{10^{10^{10}}}", "10^{10^{10}}"),
    ("\\boxed{100000!}", "100000!"),
    ("\\boxed{(x+1)^{99999}}", "(x+1)^{99999}"),
    ("x" * 200_000 + " \\boxed{4}", "4"),
    ("\\boxed{4}" + " y" * 100_000, "4"),  # the final box, then 200k characters of rambling
    ("\\boxed{" + "{" * 200 + "4" + "}" * 200 + "}", "4"),  # braces that only group
    ("\\boxed{" + _NESTED_SIN + "}", _NESTED_SIN),
    ("\\boxed{" + _POLYNOMIAL + "}", _POLYNOMIAL),  # 2297 characters: longer than any parse limit
    ("\\boxed{" + "1" * 900 + "}", "1" * 900),
    ("Step " * 20_000 + "\\boxed{\\frac{14}{3}}", "4\\frac{2}{3}"),
]


@pytest.mark.parametrize(("response", "gold"), PATHOLOGICAL_BUT_RIGHT, ids=lambda r: r[:30])
def test_pathological_answers_that_match_are_right_in_bounded_time(response, gold):
    start = time.perf_counter()
    assert grade(response, [gold])
    assert time.perf_counter() - start < 2.0


def test_only_the_region_from_the_last_box_is_sent_to_graders():
    from rlinf.rewards.math_grader import answer_region

    response = "\\boxed{3} then " + "z" * 10_000 + " \\boxedx \\boxed{4} done"
    assert answer_region(response) == "\\boxed{4} done"
    assert answer_region("no box at all") == ""
    assert grade(answer_region(response), ["4"]) == grade(response, ["4"]) is True


def test_a_long_response_still_finds_its_final_box():
    assert grade("x" * 200_000 + " so \\boxed{5}", ["5"])


def test_a_tower_is_right_when_written_the_same_way():
    assert grade("\\boxed{9^{9^{9^{9^{9}}}}}", ["9^{ 9^{9^{9^{9}}}}"])


# A mix of right and wrong, numeric and symbolic, for the thread and process tests.
MIXED = [(boxed(pred), [gold]) for pred, gold in EQUIVALENT[::4] + WRONG[::4]]


def _grade_all(pairs):
    return [grade(response, solutions) for response, solutions in pairs]


def test_grading_from_a_thread_matches_the_main_thread():
    expected = _grade_all(MIXED)
    results = {}
    thread = threading.Thread(target=lambda: results.setdefault("thread", _grade_all(MIXED)))
    thread.start()
    thread.join(timeout=60)
    assert results["thread"] == expected
    assert any(expected) and not all(expected)


def test_grading_from_spawned_processes_matches_the_main_thread():
    expected = _grade_all(MIXED)
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.starmap(grade, MIXED) == expected
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as executor:
        responses, solutions = zip(*MIXED, strict=True)
        assert list(executor.map(grade, responses, solutions)) == expected
