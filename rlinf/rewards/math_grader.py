"""Rule-based grader for math answers: is the last boxed answer of a response right?

Grading is layered from cheap to expensive, and errs on the side of "wrong":
  1. take the last \\boxed{...} / \\fbox{...} of the response (no box: wrong);
  2. normalise both answers (rlinf.rewards.normalize) and accept equal strings;
  3. decide multiple-choice letters, words and plain numbers without sympy;
  4. otherwise compare with math-verify, after guards against inputs that would make
     sympy run for ages (long answers, exponent towers, huge factorials).

math-verify's own timeouts use SIGALRM, which only works on the main thread of the main
interpreter, so they are disabled here; time is bounded by the guards above, and hard
per-item limits are enforced by process isolation in rlinf.rewards.grader_pool.
"""

from __future__ import annotations

import logging
import math
import random
import re
from collections.abc import Sequence
from functools import lru_cache

import sympy
from math_verify import LatexExtractionConfig, parse, verify

from rlinf.rewards.normalize import (
    as_fraction,
    choice_letter,
    closing_brace,
    normalize_answer,
    numeric_sequence,
)

# Boxed answers longer than this are compared only as exact strings (whitespace aside), never
# normalised or parsed; MATH answers are far shorter.
MAX_ANSWER_CHARS = 1000
# Answers longer than this only get the string comparison, never sympy.
MAX_SYMBOLIC_CHARS = 300
# A decimal must *be* the value ("0.5" = "\frac12"), not approximate it ("0.333333" !=
# "\frac13", "3.1416" != "\pi"); the tolerances only absorb floating-point noise.
FLOAT_DECIMALS = 10  # math-verify compares floats rounded to this many decimal places
FLOAT_RELATIVE_TOLERANCE = 1e-12
RANDOM_POINTS = 3  # evaluations deciding whether two rational functions are equal
# Answers beyond these limits only get the string comparison: sympy could take minutes
# (9^{9^9} would never end). Real answers with larger exponents ("2^{2023}") match as strings.
MAX_EXPONENT = 100
MAX_FACTORIAL_ARG = 1000
MAX_NESTING = 6

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_FACTORIAL_ARG = re.compile(r"(\d+)\s*!")
_WORD_ANSWER = re.compile(r"[a-z]{3,}")
# Left-hand sides that compute something ("-x", "2x+3", "x^2") rather than name the quantity.
_COMPUTED_LHS = re.compile(r"^[\d.]|[-+*/^]|\\cdot|\\times|\\frac")
_LATEX_ONLY = [LatexExtractionConfig()]


class _DropDisabledTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeout is off; that is deliberate here (see module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropDisabledTimeoutWarning())


def last_box_start(text: str) -> int:
    """Index of the last \\boxed / \\fbox command in text, -1 if none (a backwards string search:
    a 200k-character response costs no regex pass over all of it)."""
    end = len(text)
    while True:
        start = max(text.rfind("\\boxed", 0, end), text.rfind("\\fbox", 0, end))
        if start < 0 or _BOX_COMMAND.match(text, start):
            return start
        end = start  # "\\boxedx" is no box: look further back


def answer_region(text: str) -> str:
    """The part of a response grading reads: from its last box on ("" without a box)."""
    start = last_box_start(text)
    return text[start:] if start >= 0 else ""


def extract_last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...} (or "\\boxed 5") in text, else None.

    An unclosed last box ("... \\boxed{5") gives None: the final answer is incomplete.
    """
    start = last_box_start(text)
    if start < 0:
        return None
    last = _BOX_COMMAND.match(text, start)
    assert last is not None
    rest = text[last.end() :]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        start = len(rest) - len(stripped)
        end = closing_brace(rest, start)
        return rest[start + 1 : end] if end >= 0 else None
    if stripped is rest:  # "\boxedx" is not a box
        return None
    token = re.match(r"[^\s$]*", stripped).group(0)  # type: ignore[union-attr]  # * always matches
    return re.split(r"\\[\])]", token)[0] or None


def _nesting_depth(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        if ch in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "})]":
            depth -= 1
    return deepest


def _exponents(s: str):
    """Yield (argument, text after it) for every ^ in s; the argument is a group or one token."""
    for m in re.finditer(r"\^\s*", s):
        start = m.end()
        if start < len(s) and s[start] == "{":
            end = closing_brace(s, start)
            end = len(s) - 1 if end < 0 else end
            yield s[start + 1 : end], s[end + 1 :]
        else:
            token = re.match(r"\\[a-zA-Z]+|.?", s[start:]).group(0)  # type: ignore[union-attr]  # .? always matches
            yield token, s[start + len(token) :]


def _too_expensive(s: str) -> bool:
    """True for answers whose evaluation could take sympy unbounded time or memory."""
    if _nesting_depth(s) > MAX_NESTING:
        return True  # the LaTeX parser slows down steeply with nesting
    for exponent, after in _exponents(s):
        if "^" in exponent or after.lstrip().startswith("^"):
            return True  # a tower: 9^{9^{9}} has ~370 million digits
        if any(int(digits) > MAX_EXPONENT for digits in re.findall(r"\d+", exponent)):
            return True  # (x+1)^{999} is cheap to write and slow to simplify
    return any(int(arg) > MAX_FACTORIAL_ARG for arg in _FACTORIAL_ARG.findall(s))


@lru_cache(maxsize=8192)
def _parse(normalized: str) -> tuple:
    """math-verify parse of a normalised answer, cached: a GRPO batch repeats each solution."""
    parsed = parse(
        "\\boxed{" + normalized + "}",
        extraction_config=_LATEX_ONLY,
        fallback_mode="no_fallback",
        parsing_timeout=None,  # SIGALRM-based: breaks off the main thread
    )
    return tuple(parsed)


def _raw_reference(solution: str) -> str | None:
    """The reference answer as written: the last box of a worked solution, or the bare answer."""
    return extract_last_boxed(solution) if _BOX_COMMAND.search(solution) else solution


def _compact(s: str) -> str:
    return "".join(s.split())


@lru_cache(maxsize=8192)
def _reference_answer(solution: str) -> str | None:
    """Normalised reference answer."""
    answer = _raw_reference(solution)
    if answer is None:
        return None
    return normalize_answer(answer) or None


def _numeric_decision(gold: sympy.Expr, pred: sympy.Expr) -> bool | None:
    """Compare two constant expressions by value; None when evaluation is not conclusive."""
    if gold.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or pred.has(
        sympy.oo, -sympy.oo, sympy.zoo, sympy.nan
    ):
        return None
    # sympy numbers, not Python floats: values such as (10^9)^{100} overflow a float.
    scale = max(abs(sympy.N(gold, 20)), abs(sympy.N(pred, 20)))
    # Enough digits that integers like 10^{100} and 10^{100}+1 stay distinguishable.
    digits = 60 + int(int(scale).bit_length() * math.log10(2))
    difference = abs(sympy.N(gold - pred, digits))
    if gold.has(sympy.Float) or pred.has(sympy.Float):
        return difference <= FLOAT_RELATIVE_TOLERANCE * scale  # decimals hold ~15 digits
    return difference <= 1e-40  # exact expressions: equal ones evaluate to a zero difference


def _rational_functions_equal(gold: sympy.Expr, pred: sympy.Expr, symbols: list) -> bool | None:
    """Compare rational functions at fixed pseudo-random integer points, exactly.

    Two different rational functions agree at a random point of a wide range with negligible
    probability (Schwartz-Zippel), and evaluating is cheap where expanding or simplifying
    "(x+y+z+w+1)^{30}" takes sympy minutes.
    """
    rng = random.Random(0)  # fixed points: grading must be deterministic
    for _ in range(RANDOM_POINTS):
        point = {symbol: sympy.Integer(rng.randint(10**5, 10**9)) for symbol in symbols}
        equal = _numeric_decision(gold.xreplace(point), pred.xreplace(point))
        if equal is not True:
            return equal  # False, or None (e.g. a pole at this point)
    return True


def _fast_sympy_decision(gold_parsed: tuple, pred_parsed: tuple) -> bool | None:
    """Decide single expressions without sympy's simplify (the slow part of math-verify):
    constants by value, polynomials and rational functions at random points. None: undecided."""
    if len(gold_parsed) != 1 or len(pred_parsed) != 1:
        return None
    gold, pred = gold_parsed[0], pred_parsed[0]
    if not isinstance(gold, sympy.Expr) or not isinstance(pred, sympy.Expr):
        return None  # relations, sets, tuples and matrices have math-verify's own rules
    try:
        if gold.is_number and pred.is_number:
            return _numeric_decision(gold, pred)
        symbols = sorted(gold.free_symbols | pred.free_symbols, key=str)
        if (
            not gold.has(sympy.Float)
            and not pred.has(sympy.Float)
            and gold.is_rational_function(*symbols)
            and pred.is_rational_function(*symbols)
        ):
            return _rational_functions_equal(gold, pred, symbols)
    except (TypeError, ValueError, ArithmeticError):
        return None
    return None


def _symbolic_equal(pred: str, gold: str) -> bool:
    if max(len(pred), len(gold)) > MAX_SYMBOLIC_CHARS or _too_expensive(pred) or _too_expensive(gold):
        return False
    gold_parsed, pred_parsed = _parse(gold), _parse(pred)
    if not gold_parsed or not pred_parsed:
        return False
    decided = _fast_sympy_decision(gold_parsed, pred_parsed)
    if decided is not None:
        return decided
    return verify(
        list(gold_parsed),
        list(pred_parsed),
        float_rounding=FLOAT_DECIMALS,
        timeout_seconds=None,  # SIGALRM-based: breaks off the main thread
    )


def _bracket_kind(s: str) -> str | None:
    if s.startswith("\\{") and s.endswith("\\}"):
        return "set"
    if s[:1] in "([" and s[-1:] in ")]":
        return "sequence"  # a tuple or an interval
    return None


def answers_match(pred: str, gold: str) -> bool:
    """Whether two normalised answers are equivalent (gold is the reference)."""
    if pred == gold:
        return True
    gold_letter = choice_letter(gold)
    if gold_letter is not None:
        return choice_letter(pred) == gold_letter
    if _WORD_ANSWER.fullmatch(gold):
        return False  # "monday", "odd": only an equal string is right
    if {_bracket_kind(pred), _bracket_kind(gold)} == {"set", "sequence"}:
        return False  # math-verify equates \{1,2\} with (1,2); a set is not an ordered pair
    if "=" in pred and "=" not in gold and _COMPUTED_LHS.search(pred.split("=", 1)[0]):
        return False  # math-verify would compare "-x=5" or "2x+3=5" with 5 by the right side
    gold_value, pred_value = as_fraction(gold), as_fraction(pred)
    if gold_value is not None and pred_value is not None:
        return gold_value == pred_value
    gold_seq, pred_seq = numeric_sequence(gold), numeric_sequence(pred)
    if gold_seq is not None and pred_seq is not None and gold_seq[0] == pred_seq[0]:
        if gold_seq[0] in ("{}", ""):  # sets, and bare lists of solutions, are unordered
            return set(gold_seq[1]) == set(pred_seq[1])
        return gold_seq[1] == pred_seq[1]  # tuples and intervals: same brackets, same order
    if gold_seq is not None and pred_seq is not None and "" not in (gold_seq[0], pred_seq[0]):
        return False  # "[1,2)" vs "[1,2]", "(1,2)" vs "[1,2]": different objects
    return _symbolic_equal(pred, gold)


def grade(response: str, solutions: Sequence[str]) -> bool:
    """True iff the last boxed answer in response is equivalent to any of the solutions.

    A solution is a bare answer ("18", "\\frac{14}{3}") or a text whose last box holds the
    answer. Never raises: anything unexpected is graded wrong. Safe from any thread or process.
    """
    if isinstance(solutions, str):
        solutions = [solutions]
    try:
        answer = extract_last_boxed(response)
        if answer is None:
            return False
        if len(answer) > MAX_ANSWER_CHARS:  # too long to normalise or parse: only the same text is right
            return any(_compact(answer) == _compact(_raw_reference(solution) or "") for solution in solutions)
        pred = normalize_answer(answer)
        if not pred:
            return False
        for solution in solutions:
            gold = _reference_answer(solution)
            if gold is not None and answers_match(pred, gold):
                return True
        return False
    except Exception:  # malformed LaTeX can raise from deep inside sympy; that answer is wrong
        return False
