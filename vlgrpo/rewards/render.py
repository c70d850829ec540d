"""Gold answers written as a completion would write them: the inverse of the rewards' parsing. One home for the SFT
cold start's targets (`trainer/sft.py`) and the doctor's gold-answer check (`preflight.py`), so both render boxes in
the model's own convention exactly as the box rewards read them. Knows nothing of models or configs.
"""

from __future__ import annotations

import json

from vlgrpo.rewards.boxes import from_original_pixels
from vlgrpo.types import Sample

REASONS = {
    "number": "I count the matching objects in the image.",
    "box": "I find the object and read off its corners.",
    "yesno": "I check whether the object is in the image.",
}
"""The think part of a think_answer target, by answer type."""


def render_boxes(sample: Sample, box_format: str, geometry=None, decimals: int | None = None) -> str:
    """The sample's gold boxes in `box_format` (qwen2: object reference + box tokens; qwen2_5 / qwen3: JSON `bbox_2d`
    with the label; plain: lists). `decimals` None writes integers, as a model does; a number writes fixed-point
    decimals (the parsers read no exponents), for an IoU of 1 up to rounding."""
    boxes = from_original_pixels([tuple(b) for b in sample.boxes], box_format, sample.image_size, geometry)
    values = [[str(int(round(v))) if decimals is None else f"{v:.{decimals}f}" for v in b] for b in boxes]
    lists = ["[" + ", ".join(b) + "]" for b in values]
    label = sample.objects[0] if len(sample.objects) == 1 else sample.question.rstrip(".").split("the ")[-1]
    if box_format == "qwen2":
        return "".join(
            f"<|object_ref_start|>{label}<|object_ref_end|><|box_start|>({b[0]},{b[1]}),({b[2]},{b[3]})<|box_end|>"
            for b in values
        )
    if box_format in ("qwen2_5", "qwen3"):
        return "[" + ", ".join(f'{{"bbox_2d": {b}, "label": {json.dumps(label)}}}' for b in lists) + "]"
    return lists[0] if len(lists) == 1 else "[" + ", ".join(lists) + "]"


def render_completion(
    sample: Sample, answer_format: str, box_format: str, geometry=None, decimals: int | None = None
) -> str:
    """A completion stating the gold answer in `answer_format`. think_answer adds the sample's own reasoning
    (`meta.reasoning`, e.g. the shapes task's list of the objects in the image), else a one-line reason."""
    box = sample.answer_type == "box"
    answer = render_boxes(sample, box_format, geometry, decimals) if box else (sample.answer or "")
    if answer_format == "answer":
        return f"<answer>{answer}</answer>"
    think = sample.meta.get("reasoning") or REASONS.get(sample.answer_type, "I look at the image.")
    return f"<think>{think}</think><answer>{answer}</answer>"
