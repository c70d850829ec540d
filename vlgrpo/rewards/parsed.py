"""One completion, parsed once for every component of a recipe: the format verdict, the answer region, the extracted
answer, the boxes, the math expression and the typed answer, each computed on first use and then cached.

`score()` builds one `Parsed` per completion and hands it to the built-in rewards, so five box rewards read the
boxes once; a built-in called with a plain string builds its own. Knows nothing of recipes, weights or models.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from vlgrpo.rewards.boxes import Box, parse_boxes
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.extract import (
    answer_block,
    answer_region,
    extract_answer,
    final_turn,
    has_answer_tags,
    last_boxed,
)
from vlgrpo.rewards.format import format_ok
from vlgrpo.rewards.mathanswer import parse_math
from vlgrpo.rewards.verifiable import parse_choice, parse_number, parse_yesno


def _text_answer(answer: str) -> str | None:
    return answer.strip() or None


ANSWER_PARSERS: dict[str, Callable[[str], Any]] = {
    "number": parse_number,
    "choice": parse_choice,
    "yesno": parse_yesno,
    "text": _text_answer,
}
"""Extracted answer -> canonical value (None: no answer) per answer type; math and box answers come from
`Parsed.math` and `Parsed.boxes`. Gold answers are read with the same parsers."""


class Parsed:
    """Lazily parsed views of one completion under one RewardContext."""

    def __init__(self, text: str, ctx: RewardContext, images_returned: int = 0):
        self.text, self.ctx = text, ctx
        self.images_returned = images_returned
        """Images the trajectory's tools returned (multi-turn rollouts; 0 for a one-turn completion)."""
        self._typed: dict[str, Any] = {}

    @cached_property
    def format_ok(self) -> bool:
        """The completion has ctx.answer_format's structure (tags only; see `answer_parses` for the content)."""
        return format_ok(self.text, self.ctx.answer_format)

    @cached_property
    def region(self) -> str | None:
        """The answer block when there are answer tags (None when malformed), else the whole completion."""
        return answer_region(self.text)

    @cached_property
    def answer(self) -> str | None:
        """The extracted final answer (answer block, \\boxed{}, then ctx.answer_fallback)."""
        return extract_answer(self.text, self.ctx.answer_fallback)

    @cached_property
    def boxes(self) -> list[Box]:
        """Boxes as the model wrote them (ctx.box_format's units); [] when the answer tags are malformed."""
        return [] if self.region is None else parse_boxes(self.region, self.ctx.box_format)

    @cached_property
    def math(self) -> list:
        """math_verify's parse of the final answer: the \\boxed{} content or the answer block (a bare expression is
        read as LaTeX); without answer tags or a \\boxed{}, the tail of the completion by default extraction."""
        text = final_turn(self.text)  # the model's last turn: never a tool call's arguments
        if has_answer_tags(text):
            block = answer_block(text)
            return parse_math(block and (last_boxed(block) or block))
        boxed = last_boxed(text)
        return parse_math(boxed) if boxed else parse_math(text, answer=False)

    def typed_answer(self, answer_type: str) -> Any:
        """The answer read for `answer_type` (a float, a letter, "yes"/"no", text, a math parse, boxes), or None."""
        if answer_type not in self._typed:
            if answer_type == "math":
                value = self.math or None
            elif answer_type == "box":
                value = self.boxes or None
            elif answer_type in ANSWER_PARSERS:
                value = ANSWER_PARSERS[answer_type](self.answer) if self.answer else None
            else:
                raise ValueError(
                    f"answer_type {answer_type!r} has no answer parser; accepted: "
                    f"{', '.join([*ANSWER_PARSERS, 'math', 'box'])}"
                )
            self._typed[answer_type] = value
        return self._typed[answer_type]


def parsed(completion: str | Parsed, ctx: RewardContext) -> Parsed:
    """`completion` itself when score() already parsed it under this context, else a fresh Parsed."""
    if isinstance(completion, Parsed) and (completion.ctx is ctx or completion.ctx == ctx):
        return completion
    if isinstance(completion, Parsed):
        return Parsed(completion.text, ctx, completion.images_returned)
    return Parsed(completion, ctx)
