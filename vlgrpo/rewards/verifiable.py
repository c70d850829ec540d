"""Verifiable answer checks by answer type: number, choice, yesno and text (math lives in `mathanswer.py`).

Each parser turns an extracted answer string into a canonical value, or None when it is missing or *ambiguous*
(a hedge such as "3 or 4", "A or B", "yes/no" earns nothing). Patterns are bounded and linear-time.
Knows nothing of completions' tags, boxes, models or configs.
"""

from __future__ import annotations

import math
import re
import unicodedata

MAX_ANSWER_CHARS = 4000
"""An extracted answer longer than this is not a short verifiable answer (number/choice give None): the bound
keeps every parser cheap on adversarial completions."""

# ---------------------------------------------------------------- number

_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")
_WORD = re.compile(r"[a-z]+")
NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
NUMBER_WORDS["none"] = 0
MAX_NUMBER_CHARS = 64
"""A numeric token longer than this is not an answer (and never reaches float())."""


MINUS_SIGNS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})
"""U+2212 MINUS SIGN, U+FE63 SMALL HYPHEN-MINUS and U+FF0D FULLWIDTH HYPHEN-MINUS read as "-". An en dash is not a
minus: "3–5" is a range (two numbers, so no answer)."""


def parse_number(text: str | None) -> float | None:
    """The one number an answer states: digits ("3", "3.0", "-2.5", "−2.5", "1,000", "1e3") or, when no digit is
    present, a small-integer word ("three"). None when absent, ambiguous (two different values), not finite or the
    text is longer than MAX_ANSWER_CHARS."""
    if not text or len(text) > MAX_ANSWER_CHARS:
        return None
    text = text.translate(MINUS_SIGNS)
    values = set()
    for m in _NUMBER.finditer(text):
        token = m.group()
        if len(token) > MAX_NUMBER_CHARS:
            return None
        values.add(float(token.replace(",", "")))
        if len(values) > 1:
            return None
    if not values:
        values = {NUMBER_WORDS[w] for w in _WORD.findall(text.lower()) if w in NUMBER_WORDS}
    if len(values) != 1:
        return None
    value = float(values.pop())
    return value if math.isfinite(value) else None


def number_match(pred: float | None, gold: float, atol: float = 0.0, rtol: float = 0.0) -> bool:
    """|pred - gold| <= max(atol, rtol * |gold|); exact equality when both tolerances are 0."""
    return pred is not None and abs(pred - gold) <= max(atol, rtol * abs(gold))


# ---------------------------------------------------------------- choice

_CHOICE_PREFIX = re.compile(
    r"(?:the\s+)?(?:final\s+|correct\s+|best\s+)?(?:answer|option|choice)s?\b(?:\s+is)?\s*(?:[:：]\s*)?"
    r"(?:option\s+|choice\s+)?",
    re.IGNORECASE,
)
_LEADING_LETTER = re.compile(r"([(\[])?([A-Za-z])([)\]])?(?=$|[^A-Za-z0-9'’])")
_NAMED_LETTER = re.compile(r"(?i:\b(?:answer|option|choice)s?(?:\s+is)?)\s*(?:[:：]\s*)?[(\[]?([A-Z])\b")
OPTION_LETTERS = "ABCDEFGH"
"""Letters a hedge is looked for among (so "a T-shirt" or "DNA" never look like a second option)."""
_PAREN_LETTER = re.compile(rf"[(\[]([{OPTION_LETTERS}{OPTION_LETTERS.lower()}])[)\]]")
_CAPITAL = re.compile(rf"(?<![A-Za-z0-9'’])([{OPTION_LETTERS}])(?![A-Za-z0-9'’])")
_SEPARATOR_BEFORE = re.compile(r"(?:\bor|\band|[,/&|])\s*[(\[]?$", re.IGNORECASE)


def _is_english_word(s: str, start: int, end: int) -> bool:
    """A bare "A"/"a"/"I"/"i" at s[start:end] followed by a lowercase word ("A red circle", "I think") is English,
    unless "or", "and", "," or "/" precedes it ("B or A is plausible" names two options)."""
    after = s[end : end + 2]
    if s[start:end] not in ("A", "a", "I", "i") or len(after) < 2 or not after[0].isspace() or not after[1].islower():
        return False
    return not _SEPARATOR_BEFORE.search(s[max(0, start - 8) : start])


def _has_other_option(text: str, letter: str) -> bool:
    """Whether the text also presents a different option letter: "(C)", or a standalone capital A-H."""
    for m in _PAREN_LETTER.finditer(text):
        if m.group(1).upper() != letter:
            return True
    for m in _CAPITAL.finditer(text):
        if m.group(1) != letter and not _is_english_word(text, m.start(), m.end()):
            return True
    return False


def parse_choice(text: str | None) -> str | None:
    """The single option letter of an answer ("B", "(B)", "B. red", "Answer: B", "The answer is (B)"), upper-case;
    None when absent, longer than MAX_ANSWER_CHARS, or hedged ("A or B or C", "B/C", "(A) (B)")."""
    if not text or len(text) > MAX_ANSWER_CHARS:
        return None
    s = text.strip().lstrip("*_#> \t")
    prefix = _CHOICE_PREFIX.match(s)
    start = prefix.end() if prefix else 0
    m = _LEADING_LETTER.match(s, start)
    if m and (m.group(1) or m.group(3) or not _is_english_word(s, m.start(2), m.end(2))):
        letter = m.group(2).upper()
    else:
        named = {n.group(1) for n in _NAMED_LETTER.finditer(s)}
        if len(named) != 1:
            return None
        letter = named.pop()
    return None if _has_other_option(s, letter) else letter


# ---------------------------------------------------------------- yes / no

_FIRST_WORD = re.compile(r"[^A-Za-z]{0,16}([A-Za-z]+)")
_YESNO_HEDGE = re.compile(
    r"\s*,?\s*(?:(?:/|\bor\b|\|)\s*(?:yes|no)\b|(?:\band\b|&)\s*(?:yes|no)(?!\s*[A-Za-z]))", re.IGNORECASE
)
"""Right after the first word: "or"/"/"/"|" and the other answer ("yes or no", "No/yes"), or "and"/"&" and the other
answer ending the phrase ("yes and no", "Yes & no."); "Yes, and no other animals" is a yes."""


def parse_yesno(text: str | None) -> str | None:
    """ "yes" or "no" from the first word (whole word: "not", "know", "eyes", "nope" are not answers); None for
    anything else and for hedges ("yes or no", "no/yes", "yes and no")."""
    if not text:
        return None
    m = _FIRST_WORD.match(text)
    if not m or m.group(1).lower() not in ("yes", "no"):
        return None
    if _YESNO_HEDGE.match(text, m.end()):
        return None
    return m.group(1).lower()


# ---------------------------------------------------------------- text

_NON_WORD = re.compile(r"[^\w\s]")
_ARTICLES = frozenset(("a", "an", "the"))


def normalize_text(text: str | None) -> str:
    """Unicode NFKC, case-folded, punctuation dropped, articles dropped, whitespace collapsed
    ("The Red." -> "red")."""
    if not text:
        return ""
    s = _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).casefold())
    return " ".join(w for w in s.split() if w not in _ARTICLES)


def text_match(pred: str | None, gold: str) -> bool:
    """Normalised exact match; an empty prediction never matches."""
    if pred is None or len(pred) > 4 * len(gold) + 256:  # cannot normalise down to gold: skip the work
        return False
    p = normalize_text(pred)
    return bool(p) and p == normalize_text(gold)
