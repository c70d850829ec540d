"""A tool list's names -> its tools, and running one call with them.

The built-in tools are the options of `vlgrpo.registry.TOOL` (the table the config validation and the docs read); any
other name is a user function, `module:function` or `path/to/file.py:function`. Also the tools' schemas for the chat
template's `tools=`, and one parsed call run into a ToolResult: whatever the model gets wrong (a malformed call, an
unknown tool, bad arguments, a tool that raises) comes back as `ToolResult.error`, text for the model, never as an
exception.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

from PIL import Image

from vlgrpo.plugins import load_callable
from vlgrpo.registry import TOOL
from vlgrpo.rollout.tools.calls import ToolCall, ToolCallError
from vlgrpo.rollout.tools.context import Tool, ToolContext, ToolError, ToolResult

DEFAULT_TOOLS = ("zoom_in",)


def user_tool(spec: str) -> Tool:
    """A user function `fn(arguments: dict, context: ToolContext)` as a Tool, called by its function's name.

    Returns str, a PIL image, a list of them, or a ToolResult. Its description is the docstring's first paragraph
    (required: it is all the model reads about the tool); its parameters the function's `SCHEMA` attribute, a JSON
    schema of type object (default: no parameters); its gold call (`Tool.gold`, the SFT cold start's) the function's
    `GOLD` attribute, `gold(sample, context) -> arguments or None` (default: none).
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
    gold = getattr(fn, "GOLD", None)
    if gold is not None and not callable(gold):
        raise ToolError(f"tool '{spec}': GOLD must be a function gold(sample, context) -> arguments or None")
    return Tool(spec.rpartition(":")[2], fn, " ".join(description.split()), parameters, gold=gold)


@functools.cache
def resolve_tool(name: str) -> Tool:
    """A tool-list name -> its Tool: a built-in (`vlgrpo.registry.TOOL`) or a user function (loaded once per
    process)."""
    if name in TOOL.names:
        return TOOL.load(name)
    if ":" in name:
        return user_tool(name)
    raise ToolError(
        f"unknown tool '{name}'; accepted: {', '.join(TOOL.names)}, or a user function as module:function or "
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


def tools_of(names: Sequence[str]) -> list[Tool]:
    """The tools of a tool list, each once (a name and its alias are one tool), in order."""
    return list({id(tool): tool for tool in tool_table(tuple(names)).values()}.values())


def tool_schemas(names: Sequence[str] = DEFAULT_TOOLS) -> list[dict[str, Any]]:
    """The function schema of each tool, in order: `processor.apply_chat_template(messages, tools=...)`."""
    return [tool.schema for tool in tools_of(names)]


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
