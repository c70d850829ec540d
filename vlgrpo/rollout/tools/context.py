"""What a tool is and what one call of it receives and gives back: Tool (the function, its schema, its gold call),
ToolContext, ToolResult, ToolError. The types every module of the package shares; imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from vlgrpo.data.images import DEFAULT_GEOMETRY, ProcessorGeometry
from vlgrpo.rewards.boxes import convention
from vlgrpo.types import InputError, Sample


class ToolError(InputError):
    """A tool list that cannot be used (unknown name, a user function that cannot be loaded): a config error."""


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


ToolFn = Callable[[dict[str, Any], ToolContext], Any]
"""fn(arguments, context) -> str | PIL image | list of them | ToolResult."""
GoldFn = Callable[[Sample, ToolContext], dict[str, Any] | None]
"""gold(sample, context) -> the arguments of the call a gold trajectory makes on `sample`, or None (no call)."""


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
    gold: GoldFn | None = None
    """The call a gold trajectory (the SFT cold start, `trainer/sft.py`) makes on a sample; None: it offers none."""
    gold_thought: str = "I call a tool."
    """What a gold trajectory thinks before its call (answer_format think_answer)."""

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI / hermes function schema, as `apply_chat_template(..., tools=[...])` takes it."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}

    def gold_call(self, sample: Sample, context: ToolContext) -> dict[str, Any] | None:
        """The arguments of this tool's call in a gold trajectory of `sample` (its images in `context`); None when
        the tool offers no gold calls or none on this sample (it then trains on its answer alone)."""
        return None if self.gold is None else self.gold(sample, context)
