"""The calls inside a completion: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (hermes) blocks, parsed
into ToolCall, or ToolCallError whose message tells the model what to write instead. Knows nothing of the tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
"""The tags around a call. The rollout stops a turn at the first TOOL_CALL_END and must keep it in the text."""
EXPECTED_CALL = 'write <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>'


@dataclass(frozen=True)
class ToolCall:
    """One well-formed `<tool_call>` block of a completion."""

    name: str
    arguments: dict[str, Any]
    text: str
    """The block as written, tags included: completion[start:end]."""
    start: int
    end: int


@dataclass(frozen=True)
class ToolCallError:
    """A `<tool_call>` block that cannot be run; `message` tells the model what to write instead."""

    message: str
    text: str
    start: int
    end: int


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _unfence(body: str) -> str:
    """The JSON inside a ```json ... ``` (or bare ```) fence; the body unchanged without one."""
    if len(body) >= 6 and body.startswith("```") and body.endswith("```"):
        inner = body[3:-3]
        return (inner[4:] if inner.startswith("json") else inner).strip()
    return body


def _read_call(body: str) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments) of a call's JSON body, or what is wrong with it, in words for the model."""
    try:
        call = json.loads(_unfence(body.strip()))
    except json.JSONDecodeError as e:
        return f"the tool call is not valid JSON ({e})"
    if not isinstance(call, dict):
        return f"the tool call is a JSON {_json_type(call)}, not an object"
    name, arguments = call.get("name"), call.get("arguments", {})
    if not isinstance(name, str) or not name.strip():
        return 'the tool call has no "name" string'
    if not isinstance(arguments, dict):
        return f'"arguments" of the call to {name!r} is a JSON {_json_type(arguments)}, not an object'
    return name.strip(), arguments


def _parse_block(text: str, start: int, end: int) -> ToolCall | ToolCallError:
    """The block text[start:end], tags included."""
    block = text[start:end]
    read = _read_call(block[len(TOOL_CALL_START) : -len(TOOL_CALL_END)])
    if isinstance(read, str):
        return ToolCallError(f"{read}; {EXPECTED_CALL}", block, start, end)
    return ToolCall(*read, block, start, end)


def _next_block(text: str, pos: int) -> tuple[int, int] | None:
    """(start, end) of the first closed block at or after `pos`: linear scans, no regex backtracking on long text."""
    start = text.find(TOOL_CALL_START, pos)
    if start < 0:
        return None
    close = text.find(TOOL_CALL_END, start + len(TOOL_CALL_START))
    return None if close < 0 else (start, close + len(TOOL_CALL_END))


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """Every closed `<tool_call>` block of `text`, in order; an unclosed one at the end is not a call."""
    calls, pos = [], 0
    while (span := _next_block(text, pos)) is not None:
        calls.append(_parse_block(text, *span))
        pos = span[1]
    return calls


def first_tool_call(text: str) -> ToolCall | ToolCallError | None:
    """The first closed block, the one a turn stops at (None when the completion calls no tool)."""
    span = _next_block(text, 0)
    return None if span is None else _parse_block(text, *span)
