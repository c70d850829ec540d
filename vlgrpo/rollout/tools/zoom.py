"""The zoom-in tool (`ZOOM_IN`, the registry's `zoom_in`): its arguments and schema, its geometry (a box in the
model's own convention -> a crop of the image in that image's pixels) and its gold call (the sample's box, grown).

The box is converted by `rewards/boxes.py`'s `to_original_pixels`, the grounding reward's own code, so a crop and a
grounding score read a box the same way (Qwen2.5-VL's boxes are pixels of the *resized* input: cropping with the raw
numbers is off by the resize factor: DeepEyes GitHub #141). Knows nothing of parsing or running calls (calls, table).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from vlgrpo.data.images import DEFAULT_GEOMETRY, ProcessorGeometry
from vlgrpo.rewards.boxes import Box, convention, from_original_pixels, to_original_pixels
from vlgrpo.rollout.tools.context import Tool, ToolContext

if TYPE_CHECKING:
    from PIL import Image

    from vlgrpo.types import Sample

PixelBox = tuple[int, int, int, int]

MAX_ASPECT_RATIO = 100
"""A box whose long side is more than this many times its short side is refused. DeepEyes (visual_toolbox_v2.py,
`validate_bbox`, the tool its README points to) refuses max(h, w) / min(h, w) > 100 on the box clamped to the image,
and also refuses min(h, w) <= 30 px, which makes its own growth of boxes under 28 px unreachable; verl's
image_zoom_in_tool.py keeps the 100 and grows boxes under 28 px instead. We keep the 100 and grow (`_grow`)."""

_EPS = 1e-6
"""Slack when snapping to whole pixels: 756 * 1000 / 1008 may come out as 750.0000000001 and must stay 750."""


class ZoomError(ValueError):
    """The box cannot be cropped; the message is written for the model, which gets it back as the tool's answer."""


def _frame(box_format: str, image_size: tuple[int, int], geometry: ProcessorGeometry) -> str:
    """The coordinate frame the model's boxes live in, in its own words (for error messages)."""
    units = convention(box_format).units
    if units == "per_mille":
        return "0-1000 on each side"
    w, h = image_size
    if units == "resized_px":
        h, w = geometry.resized_hw(h, w)
    return f"pixels of the {w}x{h} image"


def _written(box: Box) -> str:
    """The box as the model wrote it: [600, 100, 400, 200]."""
    return "[" + ", ".join(f"{v:g}" for v in box) + "]"


def _clamp(box: Box, image_size: tuple[int, int]) -> Box:
    w, h = image_size
    x1, y1, x2, y2 = box
    return max(0.0, x1), max(0.0, y1), min(float(w), x2), min(float(h), y2)


def _check_shape(clamped: Box, written: Box, frame: str) -> None:
    """Refuse an empty box (corners swapped, zero size, or wholly outside the image) and a line-like one."""
    x1, y1, x2, y2 = clamped
    if x2 <= x1 or y2 <= y1:
        raise ZoomError(
            f"the box {_written(written)} covers no part of the image: write [x1, y1, x2, y2] with x1 < x2 and "
            f"y1 < y2, in {frame}"
        )
    long, short = max(x2 - x1, y2 - y1), min(x2 - x1, y2 - y1)
    if long / short > MAX_ASPECT_RATIO:
        raise ZoomError(
            f"the box {_written(written)} is {long / short:.0f} times longer than it is wide (at most "
            f"{MAX_ASPECT_RATIO} is accepted): draw the box around a region, not along a line"
        )


def _snap(lo: float, hi: float) -> tuple[int, int]:
    """Whole pixels covering [lo, hi] (at least one)."""
    a, b = math.floor(lo + _EPS), math.ceil(hi - _EPS)
    return a, max(b, a + 1)


def _grow(lo: int, hi: int, minimum: int, limit: int) -> tuple[int, int]:
    """One axis of a box widened around its centre to `minimum` pixels (at most the image's side `limit`), then
    shifted back inside [0, limit]. Each short axis grows alone: the region asked for stays the middle of the crop,
    where DeepEyes and verl scale both sides by the short side's ratio (a 10 x 20 box becomes 28 x 56 there, 28 x 28
    here)."""
    size = min(minimum, limit)
    if hi - lo >= size:
        return lo, hi
    lo -= (size - (hi - lo)) // 2
    lo = min(max(lo, 0), limit - size)
    return lo, lo + size


def crop_box(
    box: Box, box_format: str, image_size: tuple[int, int], geometry: ProcessorGeometry = DEFAULT_GEOMETRY
) -> PixelBox:
    """The pixel box (left, top, right, bottom) of the image to crop for a box the model wrote.

    1. convert to the image's pixels (`to_original_pixels`: 0-1000, resized pixels or pixels, by `box_format`);
    2. clamp to the image, refuse an empty or line-like box (ZoomError, a message for the model);
    3. snap outwards to whole pixels;
    4. grow a side shorter than one image token (`geometry.factor`: 28 px for Qwen2/2.5-VL, 32 for Qwen3-VL and
       Qwen3.5) to that length around its centre, inside the image. The processor would otherwise blow a sliver up
       into a whole token of interpolated pixels.

    `image_size` is (width, height) of the image being cropped; `geometry` the processor's (default: the released
    Qwen2/2.5-VL processors').
    """
    (converted,) = to_original_pixels([box], box_format, image_size, geometry)
    clamped = _clamp(converted, image_size)
    _check_shape(clamped, box, _frame(box_format, image_size, geometry))
    (x1, x2), (y1, y2) = _snap(clamped[0], clamped[2]), _snap(clamped[1], clamped[3])
    w, h = image_size
    (x1, x2), (y1, y2) = _grow(x1, x2, geometry.factor, w), _grow(y1, y2, geometry.factor, h)
    return x1, y1, x2, y2


def zoom(image: Image.Image, box: Box, box_format: str, geometry: ProcessorGeometry = DEFAULT_GEOMETRY) -> Image.Image:
    """The region of `image` the model's `box` names, at the image's own resolution.

    The crop is returned as is, not resized: the processor's smart_resize applies min_pixels / max_pixels when the
    crop is encoded, as it does for the original image, and a later box the model writes on this crop is read against
    the crop's own size, the same way (`crop_box` with image_size = crop.size). Upscaling here would only spend the
    processor's pixel budget on interpolated pixels.
    """
    return image.crop(crop_box(box, box_format, image.size, geometry))


# ---------------------------------------------------------------- the tool: arguments and schema

PARAMETERS = {
    "type": "object",
    "properties": {
        "bbox_2d": {
            "type": "array",
            "items": {"type": "number"},
            "minItems": 4,
            "maxItems": 4,
            "description": "The region to zoom in on as [x1, y1, x2, y2], its top-left and bottom-right corners, "
            "in the coordinates you use for boxes on this image.",
        },
        "label": {"type": "string", "description": "What the region shows (optional)."},
        "image_index": {
            "type": "integer",
            "description": "The image to crop: 0 (the default) is the original image, 1 the first image a tool "
            "returned, and so on.",
        },
    },
    "required": ["bbox_2d"],
}
"""The JSON schema of the arguments: DeepEyes' bbox_2d and label (its prompt's schema requires "bbox", a typo the
code does not follow: it reads bbox_2d), plus image_index."""


def _box_argument(arguments: dict[str, Any]) -> Box:
    box = arguments.get("bbox_2d")
    numbers = isinstance(box, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in box)
    if not numbers or len(box) != 4 or not all(math.isfinite(v) for v in box):
        raise ZoomError(f'"bbox_2d" must be a list of 4 numbers [x1, y1, x2, y2], got {json.dumps(box, default=str)}')
    return tuple(float(v) for v in box)  # type: ignore[return-value]


def _image_argument(arguments: dict[str, Any], images: list[Image.Image]) -> Image.Image:
    index = arguments.get("image_index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(images):
        raise ZoomError(
            f'"image_index" must be an integer from 0 to {len(images) - 1} (0 is the original image, then the '
            f"images tools returned, in order), got {json.dumps(index, default=str)}"
        )
    return images[index]


def zoom_in(arguments: dict[str, Any], context: ToolContext) -> Image.Image:
    """The tool: the region `bbox_2d` of image `image_index` (default 0, the original; DeepEyes always crops its first
    original image), cropped in that image's own pixels. `label` is accepted and unused; other keys are ignored, as
    DeepEyes and verl ignore them. ZoomError (a message for the model) for bad arguments or a box refused."""
    image = _image_argument(arguments, context.images)
    return zoom(image, _box_argument(arguments), context.box_format, context.geometry)


# ---------------------------------------------------------------- its gold call (the SFT cold start)

ZOOM_CONTEXT = 0.25
"""The share of the image's shorter side a gold call's box spans at least, around the sample's box: the crop keeps
some context around a small target (the synth `zoom` kind's 7 px shape in 448 px: a 112 px crop)."""


def zoom_region(box, image_size: tuple[int, int], context: float = ZOOM_CONTEXT) -> tuple[float, ...]:
    """`box` (original pixels) grown about its centre to at least `context` x the image's shorter side per side,
    kept inside the image."""
    (x1, y1, x2, y2), (w, h) = box, image_size
    side = context * min(w, h)
    out = []
    for lo, hi, limit in ((x1, x2, w), (y1, y2, h)):
        span = max(hi - lo, min(side, limit))
        start = min(max((lo + hi) / 2 - span / 2, 0), limit - span)
        out.append((start, start + span))
    return (out[0][0], out[1][0], out[0][1], out[1][1])


def gold_zoom(sample: Sample, context: ToolContext) -> dict[str, Any] | None:
    """A gold trajectory's call on `sample`: its first box grown by `zoom_region` on the first image, in the model's
    box convention, in whole numbers; None when the sample has no box."""
    if not sample.boxes or not context.images:
        return None
    size = context.original_size
    region = from_original_pixels([zoom_region(sample.boxes[0], size)], context.box_format, size, context.geometry)
    return {"bbox_2d": [int(round(v)) for v in region[0]]}


ZOOM_IN = Tool(
    "image_zoom_in_tool",  # DeepEyes' name, which models trained there call
    zoom_in,
    "Zoom in on a region of an image: the region inside the bounding box comes back as a new image.",
    PARAMETERS,
    aliases=("zoom_in",),
    gold=gold_zoom,
    gold_thought="I zoom in to see it better.",
)
