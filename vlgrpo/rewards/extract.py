"""Answer extraction from a completion: the single `<answer>` block, `\\boxed{}`, and configurable fallbacks.

Plain string scanning (count/find), so a 100 kB adversarial completion costs linear time. Knows nothing of answer
types, models or configs; the verifiers and the format reward build on these helpers.
"""

from __future__ import annotations

import re

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
BOXED = ("\\boxed{", "\\fbox{")
MAX_BOXED_CHARS = 2000
_BRACE = re.compile(r"[{}]")
_ANSWER_COLON = re.compile(r"answer[*_ \t]{0,8}[:：]")
_LONGEST_ANSWER_COLON = len("answer") + 8 + 1
FALLBACKS = ("answer_line", "last_line")
"""Fallback extractors, tried in order when a completion has neither an answer block nor a \\boxed{}:
answer_line = the rest of the last line containing "answer:" (any case, "**Answer:**" too); last_line = the last
non-empty line."""


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def final_turn(text: str) -> str:
    """The model's last turn of a multi-turn trajectory (`rollout/turns.py` writes its turns one after another,
    each calling turn ending at `</tool_call>`): the text after the last call, where its answer is, up to a call it
    opened and never closed (cut by max_new_tokens). A tool call's arguments (a zoom box) are never an answer; a
    trajectory whose last turn is a call has none. A one-turn completion is its own last turn."""
    cut = text.rfind(TOOL_CALL_CLOSE)
    last = text if cut < 0 else text[cut + len(TOOL_CALL_CLOSE) :]
    return last.split(TOOL_CALL_OPEN, 1)[0]


def answer_block(text: str) -> str | None:
    """Stripped content of the one `<answer>…</answer>` block; None when there is none, several, or malformed."""
    if text.count(ANSWER_OPEN) != 1 or text.count(ANSWER_CLOSE) != 1:
        return None
    start, end = text.find(ANSWER_OPEN) + len(ANSWER_OPEN), text.find(ANSWER_CLOSE)
    return text[start:end].strip() if end >= start else None


def has_answer_tags(text: str) -> bool:
    return ANSWER_OPEN in text or ANSWER_CLOSE in text


def answer_region(text: str) -> str | None:
    """Where a structured answer (boxes, a math expression) is read from.

    The answer block when the completion has answer tags (None when they are several or malformed: that is a
    format failure, and the answer is ambiguous), else the whole completion (bare JSON, bare boxes).
    """
    text = final_turn(text)
    return answer_block(text) if has_answer_tags(text) else text


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{…}` (or `\\fbox{…}`) with balanced braces; None when absent, unbalanced or
    longer than MAX_BOXED_CHARS (a final answer is short; the bound keeps the scan cheap on adversarial input)."""
    start = max(text.rfind(marker) + len(marker) if marker in text else -1 for marker in BOXED)
    if start < 0:
        return None
    depth = 1
    for m in _BRACE.finditer(text, start, start + MAX_BOXED_CHARS):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return text[start : m.start()].strip()
    return None


def answer_line(text: str) -> str | None:
    """The rest of the last line holding "answer:" ("Answer: B", "Final answer: 3", "**Answer:** yes")."""
    # A case-sensitive scan of a lowered copy is ~3x faster than re.IGNORECASE. U+0130 "İ" is the one character
    # whose lower() is two characters; made "I" first, the copy keeps the text's offsets. The last match is looked
    # for in growing tail windows, so thousands of "answer:" lines are not all visited.
    low = text.replace("\u0130", "I").lower()
    last, stop = None, len(low)
    for window in (4096, 65536, len(low)):
        start = max(0, len(low) - window)
        for last in _ANSWER_COLON.finditer(low, start, stop):  # noqa: B007  (the loop keeps the last match)
            pass
        if last is not None or start == 0:
            break
        stop = start + _LONGEST_ANSWER_COLON  # the next window overlaps this one by one match
    if last is None:
        return None
    start = last.end()  # just after the colon
    end = text.find("\n", start)
    value = text[start : end if end >= 0 else len(text)].strip().strip("*_").strip()
    return value or None


def last_line(text: str) -> str | None:
    """The last non-empty line, stripped."""
    s = text.strip()
    return s[max(s.rfind("\n"), s.rfind("\r")) + 1 :].strip() or None


_FALLBACK_FNS = {"answer_line": answer_line, "last_line": last_line}


def extract_answer(text: str, fallback: tuple[str, ...] = FALLBACKS) -> str | None:
    """The model's final answer as a short string, or None when there is none (or it is ambiguous).

    Order: the answer block (a \\boxed{} inside it wins); several/malformed answer tags give None with no
    fallback; without tags, the last \\boxed{}; then each named fallback in `fallback` (see FALLBACKS). Read from
    the model's last turn (`final_turn`).
    """
    text = final_turn(text)
    if has_answer_tags(text):
        block = answer_block(text)
        if block is None:
            return None
        return last_boxed(block) or block or None
    boxed = last_boxed(text)
    if boxed:
        return boxed
    for name in fallback:
        if name not in _FALLBACK_FNS:
            raise ValueError(f"unknown answer fallback {name!r}; accepted: {', '.join(FALLBACKS)}")
        value = _FALLBACK_FNS[name](text)
        if value:
            return value
    return None


_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"


def strip_answer_tags(text: str) -> str:
    """The content of a single `<answer>...</answer>` block (stripped), else the text unchanged.

    Every parser applies this first, so R1-style completions ("<think>...</think><answer>No</answer>") are judged
    on their answer only. Several or malformed blocks leave the whole text to the parser."""
    if text.count(_ANSWER_OPEN) == 1 and text.count(_ANSWER_CLOSE) == 1:
        start, end = text.find(_ANSWER_OPEN) + len(_ANSWER_OPEN), text.find(_ANSWER_CLOSE)
        if end >= start:
            return text[start:end].strip()
    return text
