"""Tools the policy calls inside its completion: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (hermes).

Parsing the calls, the tools by name (the built-in zoom-in, user functions), their schemas for the chat template's
`tools=`, and running one call into a ToolResult. Whatever the model gets wrong (bad JSON, an unknown tool, bad
arguments, a tool that raises) comes back as `ToolResult.error`, text for the model, never as an exception. Knows
nothing of engines, token masks or rewards: the rollout renders the result, masks its tokens and counts the errors.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from vlgrpo.data.images import DEFAULT_GEOMETRY, ProcessorGeometry
from vlgrpo.plugins import load_callable
from vlgrpo.rewards.boxes import convention
from vlgrpo.rollout import zoom
from vlgrpo.types import InputError

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
"""The tags around a call. The rollout stops a turn at the first TOOL_CALL_END and must keep it in the text."""
EXPECTED_CALL = 'write <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>'


class ToolError(InputError):
    """A tool list that cannot be used (unknown name, a user function that cannot be loaded): a config error."""


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


@dataclass
class ToolResult:
    """What a tool gives back for the tool-response turn; an error goes back to the model as text and is counted."""

    text: str | None = None
    images: list[Image.Image] = field(default_factory=list)
    error: str | None = None


@dataclass
class ToolContext:
    """What a tool sees of the trajectory it is called in."""

    images: list[Image.Image]
    """The sample's images as loaded (original pixels) first, then each image a tool returned, in order; an
    `image_index` argument counts in this list. run_tool never appends: the rollout owns the trajectory."""
    box_format: str = "plain"
    """The model's box convention (`vlgrpo.rewards.boxes`: qwen2, qwen2_5, qwen3, plain), 'auto' resolved."""
    geometry: ProcessorGeometry = DEFAULT_GEOMETRY
    """The processor's smart_resize settings: factor, min/max pixels (Qwen2.5-VL's boxes are in resized pixels)."""

    def __post_init__(self):
        convention(self.box_format)  # ValueError naming the accepted formats

    @property
    def original_size(self) -> tuple[int, int]:
        """(width, height) of the sample's first image."""
        return self.images[0].size


# ---------------------------------------------------------------- parsing


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


# ---------------------------------------------------------------- the tools

ToolFn = Callable[[dict[str, Any], ToolContext], Any]
"""fn(arguments, context) -> str | PIL image | list of them | ToolResult."""


@dataclass(frozen=True)
class Tool:
    name: str
    """The name the model calls it by."""
    fn: ToolFn
    description: str
    parameters: dict[str, Any]
    """The JSON schema of `arguments` (an object)."""
    aliases: tuple[str, ...] = ()
    """Other names a call may use."""

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI / hermes function schema, as `apply_chat_template(..., tools=[...])` takes it."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


TOOLS: dict[str, Tool] = {
    "zoom_in": Tool(
        "image_zoom_in_tool",  # DeepEyes' name, which models trained there call
        zoom.zoom_in,
        "Zoom in on a region of an image: the region inside the bounding box comes back as a new image.",
        zoom.PARAMETERS,
        aliases=("zoom_in",),
    ),
}
"""Built-in tools by the name a tool list uses; a user tool is `module:function` or `path/to/file.py:function`."""
DEFAULT_TOOLS = ("zoom_in",)


def user_tool(spec: str) -> Tool:
    """A user function `fn(arguments: dict, context: ToolContext)` as a Tool, called by its function's name.

    Returns str, a PIL image, a list of them, or a ToolResult. Its description is the docstring's first paragraph
    (required: it is all the model reads about the tool); its parameters the function's `SCHEMA` attribute, a JSON
    schema of type object (default: no parameters).
    """
    try:
        fn = load_callable(spec, "tool")
    except ValueError as e:
        raise ToolError(str(e)) from None
    try:
        inspect.signature(fn).bind({}, None)
    except (TypeError, ValueError):
        raise ToolError(f"tool '{spec}': the function must take (arguments, context)") from None
    description = (inspect.getdoc(fn) or "").split("\n\n")[0].strip()
    if not description:
        raise ToolError(f"tool '{spec}' has no docstring: its first paragraph is the description the model reads")
    parameters = getattr(fn, "SCHEMA", None) or {"type": "object", "properties": {}}
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ToolError(f"tool '{spec}': SCHEMA must be a JSON schema dict of type 'object' (the arguments)")
    return Tool(spec.rpartition(":")[2], fn, " ".join(description.split()), parameters)


@functools.cache
def resolve_tool(name: str) -> Tool:
    """A tool-list name -> its Tool: a built-in or a user function (loaded once per process)."""
    if name in TOOLS:
        return TOOLS[name]
    if ":" in name:
        return user_tool(name)
    raise ToolError(
        f"unknown tool '{name}'; accepted: {', '.join(TOOLS)}, or a user function as module:function or "
        "path/to/file.py:function"
    )


@functools.cache
def tool_table(names: tuple[str, ...]) -> dict[str, Tool]:
    """Every name a call may use -> its tool, for a tool list; ToolError when two tools answer to one name."""
    table: dict[str, Tool] = {}
    for tool in map(resolve_tool, names):
        for called in (tool.name, *tool.aliases):
            if table.get(called, tool) is not tool:
                raise ToolError(f"two tools in {list(names)} are called '{called}'")
            table[called] = tool
    return table


def tool_schemas(names: Sequence[str] = DEFAULT_TOOLS) -> list[dict[str, Any]]:
    """The function schema of each tool, in order: `processor.apply_chat_template(messages, tools=...)`."""
    tools = {id(tool): tool for tool in tool_table(tuple(names)).values()}  # each tool once (aliases), in order
    return [tool.schema for tool in tools.values()]


def _as_result(name: str, out: Any) -> ToolResult:
    """A tool's return value as a ToolResult (str, image, a list of them, or a ToolResult)."""
    if isinstance(out, ToolResult):
        return out
    parts = out if isinstance(out, list | tuple) else [out]
    if not parts or not all(isinstance(p, str | Image.Image) for p in parts):
        return ToolResult(
            error=f"tool '{name}' returned {type(out).__name__}; a tool returns str, a PIL image, a list of them or "
            "a ToolResult"
        )
    texts = [p for p in parts if isinstance(p, str)]
    return ToolResult("\n".join(texts) if texts else None, [p for p in parts if isinstance(p, Image.Image)])


def run_tool(call: ToolCall | ToolCallError, context: ToolContext, tools: Sequence[str] = DEFAULT_TOOLS) -> ToolResult:
    """Run one call with the tools of `tools`. A malformed call, an unknown name or a tool that raises gives
    ToolResult(error=...) naming the tool and what is accepted; only a bad tool list itself raises (ToolError)."""
    if isinstance(call, ToolCallError):
        return ToolResult(error=call.message)
    table = tool_table(tuple(tools))
    tool = table.get(call.name)
    if tool is None:
        known = ", ".join(dict.fromkeys(t.name for t in table.values()))
        return ToolResult(error=f"there is no tool '{call.name}'; the tools are: {known}")
    try:
        out = tool.fn(call.arguments, context)
    except ValueError as e:  # a tool's way to refuse its arguments: the message is for the model
        return ToolResult(error=f"{tool.name}: {e}")
    except Exception as e:  # noqa: BLE001 - a tool's failure is the model's answer, never the run's end
        return ToolResult(error=f"tool '{tool.name}' failed: {type(e).__name__}: {e}")
    return _as_result(tool.name, out)
