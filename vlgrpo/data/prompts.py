"""Chat messages for a Sample: the image, the question, and an instruction saying which answer format to use.

One place decides what the model is asked, so rollout, SFT targets, evals and rewards agree. Knows nothing of
tokenizers or models (the processor's chat template turns these messages into text).
"""

from __future__ import annotations

from vlgrpo.types import Sample

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


def instruction(answer_type: str, answer_format: str, box_format: str) -> str:
    """The sentence appended to the question: the expected answer shape plus the output format."""
    hint = BOX_HINTS[box_format] if answer_type == "box" else ANSWER_HINTS.get(answer_type, ANSWER_HINTS["text"])
    return hint + FORMAT_HINTS[answer_format]


def render_messages(
    sample: Sample, answer_format: str = "think_answer", box_format: str = "qwen2_5", system_prompt: str = ""
) -> list[dict]:
    """Qwen chat messages: optional system turn, then one user turn with the image first and the question."""
    if answer_format not in FORMAT_HINTS:
        raise ValueError(f"answer_format must be one of {', '.join(FORMAT_HINTS)}, got {answer_format!r}")
    if box_format not in BOX_HINTS:
        raise ValueError(f"box_format must be one of {', '.join(BOX_HINTS)}, got {box_format!r}")
    text = f"{sample.question} {instruction(sample.answer_type, answer_format, box_format)}"
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]})
    return messages
