"""The dataset row schema: turn a raw record (JSONL row, HF dataset row, label-file row) into a checked Sample.

Every rejection names the source file, the row number, the field and what was expected. Knows nothing of models.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vlgrpo.types import ANSWER_TYPES, InputError, Sample

FIELDS = ("id", "image", "question", "answer", "answer_type", "boxes", "objects", "image_size", "task", "meta")


class DataError(InputError):
    """A dataset row that cannot be used. Carries where it is so a report can list it."""

    def __init__(self, source: str, row: int | None, field: str | None, problem: str):
        self.source, self.row, self.field, self.problem = source, row, field, problem
        where = source + (f", row {row}" if row is not None else "") + (f", field '{field}'" if field else "")
        super().__init__(f"{where}: {problem}")


def _check_box(box: Any, size: tuple[int, int] | None, err) -> list[float]:
    if not isinstance(box, (list, tuple)) or len(box) != 4:
        raise err("boxes", f"each box must be [x1, y1, x2, y2] in original-image pixels, got {box!r}")
    try:
        x1, y1, x2, y2 = (float(v) for v in box)
    except (TypeError, ValueError):
        raise err("boxes", f"box coordinates must be numbers, got {box!r}") from None
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        raise err("boxes", f"box coordinates must be finite, got {box!r}")
    if x2 <= x1 or y2 <= y1:
        raise err("boxes", f"box {box!r} is inverted or empty: need x1 < x2 and y1 < y2 (xyxy order)")
    if size is not None:
        w, h = size
        if x1 < 0 or y1 < 0 or x2 > w or y2 > h:
            raise err("boxes", f"box {box!r} lies outside the {w}x{h} image (boxes are original-image pixels)")
    return [x1, y1, x2, y2]


def _image_ref(value: Any, base_dir: Path | None, err) -> str | bytes:
    """Image as an absolute path string (relative paths resolve against the dataset file) or raw bytes."""
    if isinstance(value, dict):  # HF `Image` feature: {"bytes": ..., "path": ...}
        value = value.get("bytes") or value.get("path")
    if hasattr(value, "save") and hasattr(value, "size"):  # a decoded PIL image from an HF dataset
        import io

        buf = io.BytesIO()
        value.save(buf, format="PNG")
        return buf.getvalue()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str) and value:
        path = Path(value)
        return str(path if path.is_absolute() or base_dir is None else (base_dir / path))
    raise err("image", f"expected an image path (relative to the dataset file) or image bytes, got {value!r}")


def sample_from_dict(row: Any, source: str, row_no: int | None, base_dir: Path | None = None) -> Sample:
    """Validate one raw record and build a Sample. Image files are *not* opened here (see doctor/loading)."""

    def err(field: str | None, problem: str) -> DataError:
        return DataError(source, row_no, field, problem)

    if not isinstance(row, dict):
        raise err(None, f"each row must be a JSON object, got {type(row).__name__}")
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise err(unknown[0], f"unknown field; accepted fields: {', '.join(FIELDS)} (put extras under 'meta')")
    for required in ("id", "image", "question"):
        if row.get(required) in (None, ""):
            raise err(required, "is required and missing or empty")
    if not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool):
        raise err("id", f"must be a string or integer, got {row['id']!r}")
    if not isinstance(row["question"], str):
        raise err("question", f"must be a string, got {type(row['question']).__name__}")
    answer_type = row.get("answer_type") or "text"
    if answer_type not in ANSWER_TYPES:
        raise err("answer_type", f"{answer_type!r} is not accepted; use one of: {', '.join(ANSWER_TYPES)}")
    answer = row.get("answer")
    if answer is not None and not isinstance(answer, str):
        answer = str(answer) if isinstance(answer, (int, float)) and not isinstance(answer, bool) else None
        if answer is None:
            raise err("answer", f"must be a string or number, got {row['answer']!r}")
    size = row.get("image_size")
    if size is not None:
        if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size)):
            raise err("image_size", f"must be [width, height] in pixels, got {size!r}")
        size = (int(size[0]), int(size[1]))
    boxes = row.get("boxes") or []
    if not isinstance(boxes, list):
        raise err("boxes", f"must be a list of [x1, y1, x2, y2] boxes, got {boxes!r}")
    boxes = [_check_box(b, size, err) for b in boxes]
    if answer_type == "box" and not boxes:
        raise err("boxes", "answer_type 'box' needs at least one gold box in original-image pixels")
    if answer_type != "box" and answer in (None, ""):
        raise err("answer", f"answer_type '{answer_type}' needs a gold answer")
    objects = row.get("objects") or []
    if not (isinstance(objects, list) and all(isinstance(o, str) for o in objects)):
        raise err("objects", f"must be a list of object names, got {objects!r}")
    meta = row.get("meta") or {}
    if not isinstance(meta, dict):
        raise err("meta", f"must be a mapping, got {type(meta).__name__}")
    return Sample(
        id=str(row["id"]),
        question=row["question"],
        answer=answer,
        answer_type=answer_type,
        image=_image_ref(row["image"], base_dir, err),
        boxes=boxes,
        objects=list(objects),
        image_size=size,
        task=str(row.get("task") or ""),
        meta=meta,
        row=row_no,
    )
