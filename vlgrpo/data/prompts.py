"""Chat messages for a Sample: its images and video, the question, and an instruction saying which answer format to
use; and the chat template's special tokens, which a row's text must not contain.

One place decides what the model is asked, so rollout, SFT targets, evals and rewards agree. Knows nothing of
tokenizers or models (the processor's chat template turns these messages into text).
"""

from __future__ import annotations

import re

from vlgrpo.types import InputError, Sample

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
"""Qwen2-VL / Qwen2.5-VL's special tokens, in Qwen's order (the tiny tokenizer gives them the first ids)."""
VISION_PLACEHOLDERS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
"""The image placeholders vlgrpo inserts itself; a policy never samples them."""
RESERVED_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    *VISION_PLACEHOLDERS,
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
"""Tokens a row's text must not hold: the tokenizer reads them as control tokens, so a question could end its turn and
forge another (`<|im_end|>\n<|im_start|>assistant`) or add image slots. The box and object-reference tokens are not
reserved: Qwen2-VL's grounding prompts and answers are written with them."""

ANSWER_HINTS = {
    "number": "Answer with a number.",
    "choice": "Answer with the option's letter.",
    "yesno": "Answer yes or no.",
    "text": "Answer with a word or a short phrase.",
    "math": "Answer with the final expression.",
}
BOX_HINTS = {
    "qwen2": "Answer with the box as <|box_start|>(x1,y1),(x2,y2)<|box_end|> on a 0-1000 scale.",
    "qwen2_5": 'Answer with JSON [{"bbox_2d": [x1, y1, x2, y2]}] in pixels.',
    "qwen3": 'Answer with JSON [{"bbox_2d": [x1, y1, x2, y2]}] on a 0-1000 scale.',
    "plain": "Answer with the box [x1, y1, x2, y2] in pixels.",
}
FORMAT_HINTS = {
    "think_answer": " Think first inside <think> </think>, then give the answer inside <answer> </answer>.",
    "answer": " Give the answer inside <answer> </answer>.",
}


TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>\n", "\n</tool_response>"
"""What wraps a tool's result inside its user turn."""
TOOL_RESPONSE = (
    f"<|im_end|>\n<|im_start|>user\n{TOOL_RESPONSE_OPEN}{{}}{TOOL_RESPONSE_CLOSE}<|im_end|>\n<|im_start|>assistant\n"
)
"""The turn a tool's result comes back in, as Qwen3-VL's and Qwen3.5's templates render a `tool` message (a user turn
wrapped in <tool_response>), closing the model's turn before it and opening the next (`rollout/turns.py` writes it,
and decides how a template is given it back: `tool_response_role`)."""
MAX_TOOL_TEXT_TOKENS = 64
"""Tokens of a tool's text (its words, or the error a bad call gets) that come back to the model; a longer text is cut
there, so a tool response's length is bounded and the length budget (`rowcheck.trajectory_tokens`) holds."""


def tool_response_markup(tokenizer, opening: str = "") -> int:
    """Tokens a tool-response turn adds around its image pads and text with this tokenizer: the closing <|im_end|>,
    the user turn's tags, <tool_response>, one image's vision markers, the next assistant turn's opening and what the
    generation prompt writes of it (`opening`, e.g. Qwen3.5's "<think>\n"). Qwen's released tokenizers hold each tag
    as one token; a tokenizer without them (the tiny test model's) spells them out."""
    text = TOOL_RESPONSE.format("<|vision_start|><|vision_end|>") + opening
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def reserved_tokens(text: str) -> list[str]:
    """The RESERVED_TOKENS in `text`, in the order they first appear."""
    return sorted((t for t in RESERVED_TOKENS if t in text), key=text.find)


def check_system_prompt(system_prompt: str) -> None:
    """data.system_prompt goes into every prompt: a reserved token there is a config error, not a bad row."""
    found = reserved_tokens(system_prompt)
    if found:
        raise InputError(
            f"data.system_prompt contains {', '.join(found)}: the chat template's control tokens would "
            "end the system turn early or add image slots to every prompt; remove them"
        )


def instruction(answer_type: str, answer_format: str, box_format: str) -> str:
    """The sentence appended to the question: the expected answer shape plus the output format."""
    hint = BOX_HINTS[box_format] if answer_type == "box" else ANSWER_HINTS.get(answer_type, ANSWER_HINTS["text"])
    return hint + FORMAT_HINTS[answer_format]


_MARKER = re.compile(r"(<image>|<video>)")


def user_content(sample: Sample, text: str) -> list[dict]:
    """The user turn's parts in prompt order: {"type": "image"} per image (in `images` order), {"type": "video"},
    {"type": "text"}. `<image>` / `<video>` markers in `text` place them (the schema checked that they place every
    part); without markers every visual part goes first, as Qwen's own examples put them."""
    visual = [{"type": "image"} for _ in sample.images] + ([{"type": "video"}] if sample.video is not None else [])
    if not _MARKER.search(text):
        return visual + [{"type": "text", "text": text}]
    images = iter(p for p in visual if p["type"] == "image")
    videos = iter(p for p in visual if p["type"] == "video")
    parts = []
    for piece in _MARKER.split(text):
        if piece in ("<image>", "<video>"):
            part = next(images if piece == "<image>" else videos, None)
            if part is None:
                raise InputError(f"sample '{sample.id}': more {piece} markers in the question than the row has parts")
            parts.append(part)
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def render_messages(
    sample: Sample, answer_format: str = "think_answer", box_format: str = "qwen2_5", system_prompt: str = ""
) -> list[dict]:
    """Qwen chat messages: optional system turn, then one user turn with the visual parts (first, or where the
    question's markers put them) and the question with its instruction."""
    if answer_format not in FORMAT_HINTS:
        raise ValueError(f"answer_format must be one of {', '.join(FORMAT_HINTS)}, got {answer_format!r}")
    if box_format not in BOX_HINTS:
        raise ValueError(f"box_format must be one of {', '.join(BOX_HINTS)}, got {box_format!r}")
    text = f"{sample.question} {instruction(sample.answer_type, answer_format, box_format)}"
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": user_content(sample, text)})
    return messages
