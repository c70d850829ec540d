"""A planned prompt's tokens by part: text, every image, the video's frames after temporal merging and Qwen3-VL's
timestamp labels. Pure arithmetic on an `inputs.PlanInput` (the planner prices every term from these counts)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from vlgrpo.data.rowcheck import TIMESTAMP_TOKENS  # Qwen3-VL's label and wrap of one temporal patch

if TYPE_CHECKING:
    from vlgrpo.memory.inputs import PlanInput


def temporal_patches(inp: PlanInput) -> int:
    """Temporal patches of one prompt's video: ceil(frames / temporal_patch_size) (an odd count padded, as Qwen's
    processors pad it)."""
    return math.ceil(inp.video_frames / (inp.spec.temporal_patch if inp.spec else 2))


def video_tokens(inp: PlanInput) -> int:
    """<|video_pad|> tokens of one prompt's video: temporal patches x tokens per frame."""
    return temporal_patches(inp) * inp.video_frame_tokens


def prompt_parts(inp: PlanInput) -> dict[str, int]:
    """One prompt's tokens by part: text, every image, the video's pads and (Qwen3-VL, Qwen3.5) its timestamp
    labels."""
    timestamps = inp.spec is not None and inp.spec.traits.video_timestamps
    return {
        "text": inp.text_tokens,
        "images": inp.images_per_sample * inp.image_tokens,
        "video": video_tokens(inp),
        "video_timestamps": temporal_patches(inp) * TIMESTAMP_TOKENS if timestamps else 0,
    }


def visual_tokens(inp: PlanInput) -> int:
    """Merged visual tokens of one prompt: what the tower encodes (x merge^2 patches) and the vision cache holds."""
    return inp.images_per_sample * inp.image_tokens + video_tokens(inp)


def prompt_tokens(inp: PlanInput) -> int:
    """P_ids: the whole prompt, every image and the video included."""
    return sum(prompt_parts(inp).values())
