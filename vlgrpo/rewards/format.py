"""The format reward: does a completion follow `<think>…</think><answer>…</answer>` (or the answer-only variant)?

Strict by design, since it is a reward the policy will optimise: each tag exactly once, in order, non-empty parts,
only whitespace around and between the blocks, nothing after the answer but an end-of-turn token. String counting
only (linear time). Knows nothing of answer types, boxes, models or configs.
"""

from __future__ import annotations

from vlgrpo.rewards.extract import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

ANSWER_FORMATS = ("think_answer", "answer")
END_MARKERS = ("<|im_end|>", "<|endoftext|>")
"""End-of-turn tokens a decoder may leave at the end (skip_special_tokens=False); they are not "text after the
answer"."""


def _body(text: str) -> str:
    """The completion stripped of surrounding whitespace and of up to two trailing end-of-turn markers (a bounded
    loop: thousands of repeated markers are not a format)."""
    s = text.strip()
    for _ in range(2):
        if s.endswith(END_MARKERS):
            s = s[: s.rfind("<|")].rstrip()
    return s


def _one_each(text: str, tags: tuple[str, ...]) -> bool:
    return all(text.count(tag) == 1 for tag in tags)


def think_answer_ok(text: str) -> bool:
    """`<think>reasoning</think><answer>answer</answer>`: both parts non-empty, each tag once (so nothing nested or
    repeated), whitespace only before, between and after."""
    s = _body(text)
    if not (s.startswith(THINK_OPEN) and s.endswith(ANSWER_CLOSE)):
        return False
    if not _one_each(s, (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)):
        return False
    think_end, answer_start = s.find(THINK_CLOSE), s.find(ANSWER_OPEN)
    if answer_start < think_end or s[think_end + len(THINK_CLOSE) : answer_start].strip():
        return False
    think = s[len(THINK_OPEN) : think_end]
    answer = s[answer_start + len(ANSWER_OPEN) : -len(ANSWER_CLOSE)]
    return bool(think.strip()) and bool(answer.strip())


def answer_only_ok(text: str) -> bool:
    """`<answer>answer</answer>` alone: non-empty, each answer tag once, no think tags, whitespace only around."""
    s = _body(text)
    if not (s.startswith(ANSWER_OPEN) and s.endswith(ANSWER_CLOSE)):
        return False
    if not _one_each(s, (ANSWER_OPEN, ANSWER_CLOSE)) or THINK_OPEN in s or THINK_CLOSE in s:
        return False
    return bool(s[len(ANSWER_OPEN) : -len(ANSWER_CLOSE)].strip())


def format_ok(text: str, answer_format: str = "think_answer") -> bool:
    """Whether the completion has the requested format: think_answer or answer (data.answer_format). A multi-turn
    trajectory's text (its turns one after another, each but the last ending in a tool call) has it when every
    calling turn does (`call_turn_ok`) and its last turn has the answer format."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer format {answer_format!r} is not accepted; use one of: {', '.join(ANSWER_FORMATS)}")
    *calls, last = text.split(CALL_CLOSE)
    if not all(call_turn_ok(turn + CALL_CLOSE, answer_format) for turn in calls):
        return False
    return think_answer_ok(last) if answer_format == "think_answer" else answer_only_ok(last)


CALL_OPEN, CALL_CLOSE = TOOL_CALL_OPEN, TOOL_CALL_CLOSE


def call_turn_ok(turn: str, answer_format: str) -> bool:
    """A turn that calls a tool: `<think>reasoning</think><tool_call>…</tool_call>` (think_answer; the answer-only
    format: the call alone), the call block once and non-empty, no answer tags, whitespace only around. The call's
    content is the tool's to judge: a malformed one comes back to the model as an error turn."""
    s = turn.strip()
    if not s.endswith(CALL_CLOSE) or s.count(CALL_OPEN) != 1 or ANSWER_OPEN in s or ANSWER_CLOSE in s:
        return False
    head, call = s[: s.find(CALL_OPEN)], s[s.find(CALL_OPEN) + len(CALL_OPEN) : -len(CALL_CLOSE)]
    if not call.strip():
        return False
    if answer_format == "answer":
        return not head.strip() and THINK_OPEN not in s
    head = head.strip()
    if not (head.startswith(THINK_OPEN) and head.endswith(THINK_CLOSE)) or not _one_each(
        head, (THINK_OPEN, THINK_CLOSE)
    ):
        return False
    return bool(head[len(THINK_OPEN) : -len(THINK_CLOSE)].strip())
