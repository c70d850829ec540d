"""Tools the policy calls inside its completion ("thinking with images"), one job a module:

    context  what a tool is (Tool: its function, schema and gold call) and what one call receives and gives back
             (ToolContext, ToolResult); imports none of its siblings
    calls    the `<tool_call>` blocks of a completion, parsed into ToolCall or ToolCallError
    table    tool names -> tools (the built-in ones of `vlgrpo.registry.TOOL`, user `module:function`s), their schemas,
             running one call into a ToolResult
    zoom     the zoom-in tool: a box in the model's convention -> a crop in the image's own pixels; its gold call

Knows nothing of engines, token masks or rewards: `rollout/turns.py` runs the turns and renders the results. The
names callers outside the package use are re-exported here.
"""

from vlgrpo.rollout.tools.calls import EXPECTED_CALL, TOOL_CALL_END, ToolCall, ToolCallError, first_tool_call
from vlgrpo.rollout.tools.context import Tool, ToolContext, ToolError, ToolResult
from vlgrpo.rollout.tools.table import run_tool, tool_schemas, tool_table

__all__ = [
    "EXPECTED_CALL",
    "TOOL_CALL_END",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "first_tool_call",
    "run_tool",
    "tool_schemas",
    "tool_table",
]
