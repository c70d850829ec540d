"""Predicted boxes: parse a model's box output by convention and convert it to original-image pixels, xyxy.

Conventions: qwen2 `<|box_start|>(x1,y1),(x2,y2)<|box_end|>` on 0-1000; qwen2_5 JSON `bbox_2d` in absolute pixels
of the *resized* input (Qwen's smart_resize geometry); qwen3 JSON on 0-1000; plain `[x1,y1,x2,y2]` in original
pixels. Decimals are accepted. Linear-time patterns only. Knows nothing of rewards, models or configs.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vlgrpo.families import FAMILIES
from vlgrpo.registry import BOX_FORMAT

if TYPE_CHECKING:  # the real import pulls in transformers; it happens lazily, only for qwen2_5 conversion
    from vlgrpo.data.images import ProcessorGeometry

Box = tuple[float, float, float, float]
BOX_FORMATS = tuple(name for name in BOX_FORMAT.names if name != "auto")
ARCH_BOX_FORMAT = {arch: f.box_format for arch, f in FAMILIES.items()}
"""Each arch's box convention, as `vlgrpo.families` states it."""
MAX_BOXES = 100
"""Boxes read from one completion at most (scoring is O(predicted x gold); more boxes only lower the reward)."""
MAX_BOX_TEXT = 20_000
"""Only the last this-many characters of an answer are searched for boxes (100 boxes with labels take ~7k); this
bounds the scan of a runaway completion to well under a millisecond per convention."""

_NUM = r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)"
# Qwen2-VL: "(x1,y1),(x2,y2)", with or without the <|box_start|>/<|box_end|> special tokens around it (decoding
# with skip_special_tokens=True strips them but keeps the coordinates).
_QWEN2_BOX = re.compile(rf"\(\s*({_NUM})\s*,\s*({_NUM})\s*\)\s*(?:,\s*)?\(\s*({_NUM})\s*,\s*({_NUM})\s*\)")
_KEYED_BOX = re.compile(
    rf"[\"']bbox(?:_2d)?[\"']\s*:\s*\[\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*\]"
)
_LIST_BOX = re.compile(rf"\[\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*\]")


def box_format_for_arch(arch: str) -> str:
    """The box convention a model family writes: qwen2_vl -> qwen2, qwen2_5_vl -> qwen2_5, qwen3_vl and qwen3_5 ->
    qwen3 (`vlgrpo.families`)."""
    if arch not in ARCH_BOX_FORMAT:
        raise ValueError(
            f"no box convention known for model arch {arch!r}; accepted: {', '.join(ARCH_BOX_FORMAT)} "
            f"(or set reward.box_format to one of {', '.join(BOX_FORMATS)})"
        )
    return ARCH_BOX_FORMAT[arch]


def _collect(pattern: re.Pattern, text: str) -> list[Box]:
    boxes: list[Box] = []
    for m in pattern.finditer(text):
        box = tuple(float(v) for v in m.groups())
        if all(math.isfinite(v) for v in box):
            boxes.append(box)  # type: ignore[arg-type]
        if len(boxes) == MAX_BOXES:
            break
    return boxes


@dataclass(frozen=True)
class BoxConvention:
    """How one model family writes a box: the patterns tried in order (the first that finds boxes wins) and the
    units of its numbers."""

    name: str
    patterns: tuple[re.Pattern, ...]
    units: str
    """per_mille (0-1000 of each side), resized_px (pixels of the processor-resized input) or original_px."""


QWEN2 = BoxConvention("qwen2", (_QWEN2_BOX,), "per_mille")
QWEN2_5 = BoxConvention("qwen2_5", (_KEYED_BOX, _LIST_BOX), "resized_px")
QWEN3 = BoxConvention("qwen3", (_KEYED_BOX, _LIST_BOX), "per_mille")
PLAIN = BoxConvention("plain", (_LIST_BOX,), "original_px")


@functools.cache
def convention(box_format: str) -> BoxConvention:
    """The registered convention named `box_format` (vlgrpo.registry.BOX_FORMAT); ValueError for another name.
    Looked up once per name: every box reward of every completion asks."""
    if box_format not in BOX_FORMATS:
        raise ValueError(f"box format {box_format!r} is not accepted; use one of: {', '.join(BOX_FORMATS)}")
    return BOX_FORMAT.load(box_format)


def parse_boxes(text: str, box_format: str) -> list[Box]:
    """Boxes as written by the model, in the convention's own units (0-1000, resized px or original px).

    qwen2: "(x1,y1),(x2,y2)" pairs. qwen2_5 / qwen3: the `bbox_2d` (or `bbox`) lists of JSON objects, else bare
    `[x1,y1,x2,y2]` lists. plain: bare lists. Invalid or truncated JSON around the numbers does not matter.
    """
    text = text[-MAX_BOX_TEXT:]
    for pattern in convention(box_format).patterns:
        boxes = _collect(pattern, text)
        if boxes:
            return boxes
    return []


def to_original_pixels(
    boxes: list[Box], box_format: str, image_size: tuple[int, int] | None, geometry: ProcessorGeometry | None = None
) -> list[Box]:
    """Convert parsed boxes to original-image pixels. image_size is the original (width, height).

    qwen2 / qwen3: v / 1000 * side. qwen2_5: x * (orig_w / resized_w), y * (orig_h / resized_h), where the resized
    size is the processor's smart_resize of the original (`geometry`, default: the released processors', see
    `vlgrpo.data.images.DEFAULT_GEOMETRY`). plain: as is.
    """
    units = convention(box_format).units
    if units == "original_px":
        return list(boxes)
    if image_size is None:
        raise ValueError(f"box format {box_format!r} needs the original image size (width, height) to convert boxes")
    w, h = image_size
    if units == "per_mille":
        sx, sy = w / 1000.0, h / 1000.0
    else:  # resized_px
        if geometry is None:
            from vlgrpo.data.images import DEFAULT_GEOMETRY

            geometry = DEFAULT_GEOMETRY
        rh, rw = geometry.resized_hw(h, w)
        sx, sy = w / rw, h / rh
    return [(x1 * sx, y1 * sy, x2 * sx, y2 * sy) for x1, y1, x2, y2 in boxes]


def from_original_pixels(
    boxes: list[Box], box_format: str, image_size: tuple[int, int] | None, geometry: ProcessorGeometry | None = None
) -> list[Box]:
    """The inverse of `to_original_pixels` (for writing gold answers in a model's convention, and for tests)."""
    unit = to_original_pixels([(1.0, 1.0, 1.0, 1.0)], box_format, image_size, geometry)[0]
    return [(x1 / unit[0], y1 / unit[1], x2 / unit[0], y2 / unit[1]) for x1, y1, x2, y2 in boxes]
