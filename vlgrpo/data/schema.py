"""The dataset row schema: turn a raw record (JSONL row, HF dataset row, label-file row) into a checked Sample.

Every rejection names the source file, the row number, the field and what was expected. Knows nothing of models.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vlgrpo.types import ANSWER_TYPES, InputError, Sample, Video

FIELDS = (
    "id",
    "image",
    "images",
    "video",
    "question",
    "answer",
    "answer_type",
    "boxes",
    "objects",
    "image_size",
    "task",
    "meta",
)
MARKERS = ("<image>", "<video>")
"""Markers in a question that place the row's images (in `images` order) and its video; without any, every visual
part goes before the question (Qwen's convention)."""
VIDEO_KEYS = ("path", "frames", "fps", "max_frames")


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


def _image_ref(value: Any, base_dir: Path | None, err, fld: str = "image") -> str | bytes:
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
        return _path(value, base_dir)
    raise err(fld, f"expected an image path (relative to the dataset file) or image bytes, got {value!r:.120}")


def _path(value: str, base_dir: Path | None) -> str:
    """A path as written in a row, relative ones resolved against the dataset file's directory."""
    path = Path(value)
    return str(path if path.is_absolute() or base_dir is None else (base_dir / path))


def _video(value: Any, base_dir: Path | None, err) -> Video:
    """`video`: a file path, a list of frame files, or a mapping {path | frames, fps, max_frames}."""
    overrides: dict[str, Any] = {}
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(VIDEO_KEYS))
        if unknown or ("path" in value) == ("frames" in value):
            raise err(
                "video",
                f"a video mapping has `path` (a video file) or `frames` (image files), and optionally "
                f"`fps` and `max_frames`; got keys {sorted(value)}",
            )
        fps, max_frames = value.get("fps"), value.get("max_frames")
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0):
            raise err("video", f"fps must be a number > 0 (frames per second the model sees), got {fps!r}")
        if max_frames is not None and (
            isinstance(max_frames, bool) or not isinstance(max_frames, int) or max_frames < 2
        ):
            raise err("video", f"max_frames must be an integer >= 2, got {max_frames!r}")
        overrides = {"fps": None if fps is None else float(fps), "max_frames": max_frames}
        value = value.get("path", value.get("frames"))
    if isinstance(value, str) and value:
        return Video(path=_path(value, base_dir), **overrides)
    if isinstance(value, (list, tuple)) and value:
        return Video(frames=[_image_ref(f, base_dir, err, "video") for f in value], **overrides)
    raise err(
        "video",
        f"expected a video file path, a list of frame image files, or a mapping with `path` or "
        f"`frames`, got {value!r:.120}",
    )


def _given(value: Any) -> bool:
    return value not in (None, "") and not (isinstance(value, (list, tuple, dict)) and not value)


def _visuals(row: dict, base_dir: Path | None, err) -> tuple[list[str | bytes], Video | None]:
    """The row's images in prompt order (`image`, or the list `images`) and its video."""
    image, images, video = row.get("image"), row.get("images"), row.get("video")
    if _given(image) and _given(images):
        raise err("images", "give `image` (the one-image form) or `images` (a list, in prompt order), not both")
    if isinstance(image, (list, tuple)):
        raise err("image", "holds one image; put several in `images` (a list, in prompt order)")
    refs = [_image_ref(image, base_dir, err)] if _given(image) else []
    if _given(images):
        if not isinstance(images, (list, tuple)):
            raise err("images", f"must be a list of image paths (or bytes) in prompt order, got {images!r:.120}")
        refs = [_image_ref(v, base_dir, err, "images") for v in images]
    clip = _video(video, base_dir, err) if _given(video) else None
    if not refs and clip is None:
        raise err("image", "is required and missing or empty (a row needs `image`, `images` or `video`)")
    return refs, clip


def _boxes(value: Any, images: int, size: tuple[int, int] | None, err) -> tuple[list[list[float]], list[int]]:
    """(boxes in original-image pixels, the image index of each when the row has several images). A box on a row with
    several images is {"image": i, "box": [x1, y1, x2, y2]}, i the 0-based index in `images`."""
    if not isinstance(value, list):
        raise err("boxes", f"must be a list of [x1, y1, x2, y2] boxes, got {value!r}")
    if value and images == 0:
        raise err("boxes", "a box lies in an image, and this row has only a video")
    boxes, owners = [], []
    for box in value:
        owner = 0
        if isinstance(box, dict):
            owner = box.get("image")
            named = set(box) == {"image", "box"} and isinstance(owner, int) and not isinstance(owner, bool)
            if not (named and 0 <= owner < images):
                raise err(
                    "boxes",
                    f'a box naming its image is {{"image": i, "box": [x1, y1, x2, y2]}} with i in '
                    f"0..{images - 1} (the row's images, in order), got {box!r}",
                )
            box = box["box"]
        elif images > 1:
            raise err(
                "boxes",
                f'the row has {images} images: name the image of each box, {{"image": i, "box": '
                f"[x1, y1, x2, y2]}} with i the 0-based index in `images`; got {box!r}",
            )
        boxes.append(_check_box(box, size, err))
        owners.append(owner)
    return boxes, owners if images > 1 else []


def _check_markers(question: str, images: int, video: bool, err) -> None:
    """`<image>` / `<video>` markers place every visual part or none: their counts match the row's."""
    n_image, n_video = (question.count(m) for m in MARKERS)
    if (n_image or n_video) and (n_image, n_video) != (images, int(video)):
        raise err(
            "question",
            f"has {n_image} <image> and {n_video} <video> marker(s) but the row has {images} "
            f"image(s) and {int(video)} video: each <image> places the next image of the row and <video> its "
            "video; write one marker per part, or none to put them all before the question",
        )


def sample_from_dict(row: Any, source: str, row_no: int | None, base_dir: Path | None = None) -> Sample:
    """Validate one raw record and build a Sample. Image files are *not* opened here (see doctor/loading)."""

    def err(field: str | None, problem: str) -> DataError:
        return DataError(source, row_no, field, problem)

    if not isinstance(row, dict):
        raise err(None, f"each row must be a JSON object, got {type(row).__name__}")
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise err(unknown[0], f"unknown field; accepted fields: {', '.join(FIELDS)} (put extras under 'meta')")
    if row.get("id") in (None, ""):
        raise err("id", "is required and missing or empty")
    images, video = _visuals(row, base_dir, err)
    if row.get("question") in (None, ""):
        raise err("question", "is required and missing or empty")
    if not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool):
        raise err("id", f"must be a string or integer, got {row['id']!r}")
    if not isinstance(row["question"], str):
        raise err("question", f"must be a string, got {type(row['question']).__name__}")
    _check_markers(row["question"], len(images), video is not None, err)
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
        if len(images) != 1:
            raise err(
                "image_size",
                "is the size of the row's one image; leave it out on a row with several images "
                "or a video (their sizes are read from the files)",
            )
    boxes, box_images = _boxes(row.get("boxes") or [], len(images), size, err)
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
        images=images,
        video=video,
        boxes=boxes,
        box_images=box_images,
        objects=list(objects),
        image_size=size,
        task=str(row.get("task") or ""),
        meta=meta,
        row=row_no,
    )
