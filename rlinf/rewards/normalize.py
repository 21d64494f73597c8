"""String normalisation of LaTeX answers, used by the math grader before any sympy work.

The goal is a canonical string for the forms MATH-style answers come in, so that most
right answers match by plain string equality and most plain numbers compare exactly
without sympy. The output stays valid LaTeX because it is also fed to math-verify.
"""

from __future__ import annotations

import re
from fractions import Fraction

# Plain-text units that may trail a number without \text{...}; kept short on purpose,
# because stripping a word that is part of the answer would be worse than missing a unit.
_UNIT_WORDS = (
    "square units|square feet|square inches|square meters|square centimeters|sq units|units?|"
    "cm|mm|km|m|meters?|centimeters?|inches|inch|feet|foot|ft|miles?|yards?|"
    "degrees?|dollars?|cents?|hours?|minutes?|seconds?|days?|years?|mph|percent"
)
_TRAILING_UNIT = re.compile(rf"(?<=[\d}}])\s+(?:{_UNIT_WORDS})(?:\^\{{?[23]\}}?|\^[23])?$")

# Text-like wrappers whose argument is plain text (units, words, choice letters).
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mbox|mathrm|mathbf)\s*\{")
_UNIT_TEXT = re.compile(r"[A-Za-z][A-Za-z .]+")  # two letters or more: "\mathrm{i}" is not a unit
_CONNECTIVE = re.compile(r"^\s*(?:and|or|,)\s*$")

_SPACING = re.compile(r"(?<!\\)\\[,;: ]|\\q?quad|~|\\displaystyle|\\limits")
_SIZE_CMD = re.compile(r"\\(?:left|right|[bB]igg?[lr]?)(?![a-zA-Z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree")
_PERCENT = re.compile(r"\\%|%|\\text\{\s*\\?%\s*\}")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SIMPLE_LHS = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?(?:\([a-z0-9]*\))?\s*=(?!=)")
_CHOICE = re.compile(r"^(?:\(([A-E])\)|([A-E])$)")

_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)"
_INT_OR_DEC = re.compile(rf"^{_NUMBER}$")
_FRAC = re.compile(rf"^([+-]?)\\frac\{{({_NUMBER})\}}\{{({_NUMBER})\}}$")
_SLASH = re.compile(r"^([+-]?\d+)/(\d+)$")
_MIXED = re.compile(r"^(\d+)\\frac\{(\d+)\}\{(\d+)\}$")
_SCI = re.compile(rf"^({_NUMBER})(?:\\times|\\cdot)10\^\{{?([+-]?\d{{1,3}})\}}?$")


def closing_brace(text: str, open_idx: int) -> int:
    """Index of the brace closing the one at open_idx, or -1 if unbalanced."""
    depth = 0
    for i in range(open_idx, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _strip_enclosing_braces(s: str) -> str:
    """ "{{4}}" -> "4": braces around the whole answer only group it (one pass over the string)."""
    partner: dict[int, int] = {}
    opened: list[int] = []
    for i, char in enumerate(s):
        if char == "{":
            opened.append(i)
        elif char == "}" and opened:
            partner[opened.pop()] = i
    depth = 0
    while depth < len(s) - 1 - depth and partner.get(depth) == len(s) - 1 - depth:
        depth += 1
    return s[depth : len(s) - depth].strip() if depth else s


def _strip_text_commands(s: str) -> str:
    """Unwrap \\text{...}-like commands; drop them when they are trailing units or connectives."""
    while m := _TEXT_CMD.search(s):
        end = closing_brace(s, m.end() - 1)
        if end < 0:
            return s
        content = s[m.end() : end]
        before, after = s[: m.start()], s[end + 1 :]
        trailing = re.fullmatch(r"\s*(?:\^\{?[23]\}?)?\s*", after) is not None
        if trailing and before.strip() and _UNIT_TEXT.fullmatch(content.strip()):
            s = before  # a unit after a value: "5\text{ cm}^2" -> "5"
        elif _CONNECTIVE.match(content):
            s = before + "," + after  # "2\text{ or }3" -> "2,3"
        else:
            s = before + content + after
    return s


def _canonical_shorthand(s: str) -> str:
    """Brace the one-token arguments of \\frac, \\sqrt, ^ and _ ("\\frac12" -> "\\frac{1}{2}")."""
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\s*(\{[^{}]*\})\s*(\w)", r"\\frac\1{\2}", s)
    s = re.sub(r"\\sqrt\s*(\w)", r"\\sqrt{\1}", s)
    return re.sub(r"([\^_])\s*(\w)", r"\1{\2}", s)


def _remove_spaces(s: str) -> str:
    """Drop whitespace, except where it ends a command name ("\\pi r" must not become "\\pir")."""
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])", "\\1\x00", s)
    return re.sub(r"\s+", "", s).replace("\x00", " ")


def normalize_answer(answer: str) -> str:
    """Canonical form of one final answer (the content of a box, or a bare reference answer)."""
    s = answer.strip()
    s = s.replace("\\$", "").replace("$", "").replace("\\(", "").replace("\\)", "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = s.replace("bmatrix", "pmatrix").replace("\\right.", "")
    s = _SIZE_CMD.sub("", s)
    s = s.replace("\\!", "")  # negative thin space, as in "1,\!000"
    s = _SPACING.sub(" ", s)
    s = _DEGREES.sub("", s)
    s = _PERCENT.sub("", s)
    s = s.replace("{,}", ",")
    s = _strip_text_commands(s)
    s = s.replace("\\dots", "\\ldots").replace("\\cdots", "\\ldots")
    s = _strip_enclosing_braces(s.strip())
    s = s.strip().rstrip(".").strip()
    s = _TRAILING_UNIT.sub("", s).strip()
    if _THOUSANDS.fullmatch(s):  # only a whole-string "1,000"; "(1,2)" and "1,2" never match
        s = s.replace(",", "")
    if s.count("=") == 1:
        s = _SIMPLE_LHS.sub("", s)  # "x = 5" -> "5", "f(3) = 5" -> "5"
    s = _canonical_shorthand(s)
    s = _remove_spaces(s)
    if re.fullmatch(r"[A-Za-z ]{2,}", s):
        s = s.lower()  # word answers such as "Monday" are case-insensitive
    return s


def choice_letter(normalized: str) -> str | None:
    """Multiple-choice letter of an answer like "(C)", "C" or "(C) 12", else None."""
    m = _CHOICE.match(normalized)
    return (m.group(1) or m.group(2)) if m else None


def as_fraction(normalized: str) -> Fraction | None:
    """Exact value of a plain number (integer, decimal, fraction, mixed number, a\\times10^k)."""
    s = normalized
    try:
        if _INT_OR_DEC.match(s):
            return Fraction(s)
        if m := _FRAC.match(s):
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return -value if m.group(1) == "-" else value
        if m := _SLASH.match(s):
            return Fraction(int(m.group(1)), int(m.group(2)))
        if m := _MIXED.match(s):  # "2\frac{1}{2}" is a mixed number in MATH answers
            return int(m.group(1)) + Fraction(int(m.group(2)), int(m.group(3)))
        if m := _SCI.match(s):
            return Fraction(m.group(1)) * Fraction(10) ** int(m.group(2))
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _split_top_level(s: str) -> list[str]:
    """Split on commas that are not inside braces, brackets or parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return parts


def numeric_sequence(normalized: str) -> tuple[str, tuple] | None:
    """(delimiters, values) of a tuple, interval, set or bare list whose elements are all plain
    numbers or +-infinity, e.g. "[-2,3)" -> ("[)", (-2, 3)), "1,2" -> ("", (1, 2)); else None."""
    s = normalized
    if s.startswith("\\{") and s.endswith("\\}"):
        delimiters, body = "{}", s[2:-2]
    elif len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        delimiters, body = s[0] + s[-1], s[1:-1]
    elif "," in s:
        delimiters, body = "", s
    else:
        return None
    values: list[str | Fraction] = []
    for element in _split_top_level(body):
        if element in ("\\infty", "+\\infty", "-\\infty"):
            values.append(element.lstrip("+"))
            continue
        value = as_fraction(element)
        if value is None:
            return None
        values.append(value)
    return delimiters, tuple(values)
