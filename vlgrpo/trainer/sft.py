"""SFT cold start: render each sample's gold answer in the target format and train on it teacher-forced.

Same data pipeline, prompts, feature injection and backends as GRPO (the R1 recipe: SFT fixes the format, RL
improves the answers). The loss is the mean negative log-likelihood over all completion tokens of the batch.
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


def render_box(sample: Sample, box_format: str, geometry) -> str:
    """Gold boxes written the way the model should write them (the inverse of the reward's parsing)."""
    boxes = from_original_pixels([tuple(b) for b in sample.boxes], box_format, sample.image_size, geometry)
    boxes = [[int(round(v)) for v in b] for b in boxes]
    label = sample.objects[0] if len(sample.objects) == 1 else sample.question.rstrip(".").split("the ")[-1]
    if box_format == "qwen2":
        return "".join(
            f"<|object_ref_start|>{label}<|object_ref_end|><|box_start|>({b[0]},{b[1]}),({b[2]},{b[3]})<|box_end|>"
            for b in boxes
        )
    if box_format in ("qwen2_5", "qwen3"):
        return json.dumps([{"bbox_2d": b, "label": label} for b in boxes])
    return json.dumps(boxes[0] if len(boxes) == 1 else boxes)


def render_target(sample: Sample, answer_format: str, box_format: str, geometry=None) -> str:
    """The completion SFT teaches: `meta.sft_target` when the dataset provides one, else the rendered gold."""
    if sample.meta.get("sft_target"):
        return str(sample.meta["sft_target"])
    answer = render_box(sample, box_format, geometry) if sample.answer_type == "box" else (sample.answer or "")
    if answer_format == "answer":
        return f"<answer>{answer}</answer>"
    reason = REASONS.get(sample.answer_type, "I look at the image.")
    return f"<think>{reason}</think><answer>{answer}</answer>"
