"""The published scoring rules of the reasoning benchmarks, rule-based and model-free: MathVista's answer
normalisation (evaluation/calculate_score.py), MMMU's response parsing (mmmu/utils/eval_utils.py), R1-V's SuperCLEVR
counting rule (src/eval/test_qwen2vl_counting_superclevr.py). Each function takes an answer already read from the
completion (our answer block / \\boxed{} / fallbacks); where the benchmark's code reads the whole response instead,
the docstring says so. Knows nothing of samples, models or files.
"""

from __future__ import annotations

import ast
import re

from vlgrpo.rewards.mathanswer import parse_math
from vlgrpo.rewards.verifiable import parse_number

MAX_COMPARED_CHARS = 1000
"""An extracted answer is cut to this many characters before edit distances and substring searches (a final answer
is short; the bound keeps the quadratic edit distance cheap on a runaway completion)."""


# ---------------------------------------------------------------- MathVista


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions cost 1), as python-Levenshtein's `distance`."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def most_similar_choice(text: str, choices: list[str]) -> str:
    """MathVista's `get_most_similar`: the choice at the smallest edit distance (the first one on a tie)."""
    distances = [edit_distance(text[:MAX_COMPARED_CHARS], c) for c in choices]
    return choices[distances.index(min(distances))]


def _to_float(text: str) -> float | None:
    """float(text) as MathVista does; else the one number the answer states (our parser: "3 cm", "x = 2.5"); else
    a LaTeX value ("\\frac{3}{4}") through math_verify. The fallbacks stand in for MathVista's GPT-4 extraction,
    which turns "3 cm" into "3" before this step."""
    try:
        return float(text)
    except ValueError:
        pass
    value = parse_number(text)
    if value is not None:
        return value
    parsed = parse_math(text)
    if parsed and getattr(parsed[0], "is_number", False):
        try:
            return float(parsed[0])
        except (TypeError, ValueError):
            return None
    return None


def parse_list(text: str) -> list | None:
    """A Python-style list of numbers or strings ("[1, 2, 3]", "[2014,2016]"), else None."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")) or len(text) > MAX_COMPARED_CHARS:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, list) else None


def mathvista_normalize(
    extraction: str | None, choices: list[str] | None, question_type: str, answer_type: str, precision: int | None
) -> str | None:
    """MathVista's `normalize_extracted_answer`, on an answer our parsers read (None: no answer, never correct):

    - multi_choice: a choice text given verbatim is that choice; else the letter in "(B) ..." (upper-cased), or a
      bare letter in range, is that choice; else the closest choice by edit distance. (MathVista maps an *empty*
      extraction to the closest choice too, i.e. the shortest one, a free hit; here no answer is wrong.)
    - integer: str(int(float(x))) (so 2.7 -> "2", as MathVista truncates);
    - float: str(round(float(x), precision));
    - list: the list re-printed as Python prints it ("[2014,2016]" -> "[2014, 2016]"; MathVista compares the GPT-4
      extraction's string as it is);
    - anything else: the stripped text."""
    if extraction is None or not extraction.strip():
        return None
    text = extraction.strip()
    if question_type == "multi_choice":
        choices = list(choices or [])
        if not choices:
            return None
        # MathVista's order: a "(x)" letter first, then a letter names its choice, else the most similar choice (a
        # choice written out verbatim is its own most similar one, unless it holds a "(x)": "(b)" among the
        # choices ['(c)', '(a)', ...] is letter B, the second choice, as the official code reads it)
        letter = re.findall(r"\(([a-zA-Z])\)", text)
        if letter:
            text = letter[0].upper()
        letters = [chr(ord("A") + i) for i in range(len(choices))]
        if text in letters:
            return choices[letters.index(text)]
        return most_similar_choice(text, choices)
    if answer_type in ("integer", "float"):
        value = _to_float(text)
        if value is None:
            return None
        try:
            return str(int(value)) if answer_type == "integer" else str(round(value, int(precision or 0)))
        except (OverflowError, ValueError):
            return None
    if answer_type == "list":
        value = parse_list(text)
        return None if value is None else str(value)
    return text


def mathvista_gold(answer: str, answer_type: str) -> str:
    """The gold answer as MathVista compares it: the string itself; a list answer re-printed like a prediction."""
    if answer_type == "list":
        value = parse_list(answer)
        return answer if value is None else str(value)
    return answer


# ---------------------------------------------------------------- SuperCLEVR (R1-V)

_R1V_COUNT = re.compile(r"<answer>\s*(\d+)\s*</answer>")


def r1v_count(completion: str) -> int | None:
    """R1-V's own rule, on the whole completion: the digits of the first `<answer> N </answer>`, else None."""
    m = _R1V_COUNT.search(completion)
    return int(m.group(1)) if m else None


def count_value(extraction: str | None) -> int | None:
    """The count an answer states (our parser: "3", "3 objects", "three", "**3**"), when it is a whole number."""
    value = parse_number(extraction)
    return int(value) if value is not None and value.is_integer() else None


# ---------------------------------------------------------------- MMMU


def mmmu_choice(response: str | None, options: list[str]) -> str | None:
    """MMMU's `parse_multi_choice_response` on an answer: an option letter in parentheses "(B)", else a bare letter
    " B ", else an option's text inside the answer (case-insensitive); several candidates: the one that occurs last.
    Two departures: MMMU reads the option text only in responses of more than 5 words (ours is the short answer
    block, so the text is read at any length), and when nothing matches MMMU picks a random letter, where this
    gives None (wrong)."""
    if response is None or not options:
        return None
    letters = [chr(ord("A") + i) for i in range(len(options))]
    for char in ",.!?;:'":
        response = response.strip(char)
    response = f" {response} "  # the whole response, as MMMU reads it: the answer is usually at its end
    candidates = [c for c in letters if f"({c})" in response]
    where = lambda c: response.rfind(f"({c})")  # noqa: E731
    if not candidates:
        candidates = [c for c in letters if f" {c} " in response]
        where = lambda c: response.rfind(f" {c} ")  # noqa: E731
    if not candidates:
        low = response.lower()
        candidates = [c for c, text in zip(letters, options) if text.strip() and text.lower() in low]
        where = lambda c: low.rfind(options[letters.index(c)].lower())  # noqa: E731
    if not candidates:
        return None
    return max(candidates, key=lambda c: (where(c), -letters.index(c)))  # the last; a tie keeps the first letter


_MMMU_NUMBERS = (
    re.compile(r"-?\b\d{1,3}(?:,\d{3})+\b"),  # 1,000
    re.compile(r"-?\d+(?:\.\d+)?[eE][+-]?\d+"),  # 1e3
    re.compile(r"-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d])"),  # 12, 1.5
)
_MMMU_KEYS = ("could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result ")


def _mmmu_normalize(text: str) -> list:
    """MMMU's `normalize_str`: a number -> [its value rounded to 2 places]; a string -> [lower-cased], a one-letter
    string padded with a space on either side (so "a" is not found inside every word)."""
    text = text.strip()
    try:
        return [round(float(text.replace(",", "")), 2)]
    except (ValueError, OverflowError):
        text = text.lower()
        return [f" {text}", f"{text} "] if len(text) == 1 else [text]


def mmmu_open_predictions(response: str | None) -> list:
    """MMMU's `parse_open_response` on an answer: the tail after the last key phrase ("is ", "so ", "answer ",
    "=" in the last sentence, ...) of each sentence, plus every number in those tails, normalised."""
    if not response:
        return []
    response = response.strip().strip(".").lower()  # the whole response, as MMMU reads it
    sentences = re.split(r"\.\s(?=[A-Z])|\n", response)
    keys, tails = list(_MMMU_KEYS), []
    for i, sentence in enumerate(sentences):
        if i == len(sentences) - 1:
            keys.append("=")
        shortest = None  # MMMU's loop as written: an empty tail is replaced by the next, and may replace a longer one
        for tail in (sentence.split(k)[-1].strip() for k in keys if k in sentence):
            if not shortest or len(tail) < len(shortest):
                shortest = tail
        if shortest and shortest not in (":", ",", ".", "!", "?", ";", "'"):
            tails.append(shortest)
    tails = tails or [response]
    found = tails + [n for t in tails for pattern in _MMMU_NUMBERS for n in pattern.findall(t)]
    return list(dict.fromkeys(v for text in found for v in _mmmu_normalize(text)))


def mmmu_open_correct(gold: str | list[str], predictions: list) -> bool:
    """MMMU's `eval_open`: a predicted number equals a gold number (both rounded to 2 places), or a gold string
    (lower-cased) occurs inside a predicted string. A gold written as a list ("['24/7', '3.429']") accepts any of its
    items (MMMU's code accepts a list gold; a string that spells one is read as one here)."""
    golds = parse_list(gold) if isinstance(gold, str) else gold
    golds = [str(g) for g in golds] if golds else [gold]
    normalized = [v for g in golds for v in _mmmu_normalize(str(g))]
    for pred in predictions:
        if isinstance(pred, str):
            if any(isinstance(g, str) and g in pred for g in normalized):
                return True
        elif pred in normalized:
            return True
    return False
