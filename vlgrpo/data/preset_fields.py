"""Reading the fields of a row in another project's shape, for the presets (`presets.py`): questions (format
instructions stripped), answers and the answer type they imply, boxes and their scale (converted to original-image
pixels), images (paths, bytes, data URLs) and generated ids. What cannot be read raises DataError or RowSkipped
naming the row. Knows nothing of models; it opens an image header only for the size of a box row that declares none.
"""

from __future__ import annotations

import ast
import base64
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlgrpo.data.images import ImageError, image_size
from vlgrpo.data.schema import DataError


class ImageUnusable(DataError):
    """A row whose image file is missing, or does not open where its size is needed (a box row that declares none).
    `image` is where it was looked for (a path, or `<N bytes>`): `vlgrpo data convert` lists these rows by path."""

    def __init__(self, source: str, row: int | None, image: str, problem: str):
        self.image = image
        super().__init__(source, row, "image", problem)


class RowSkipped(DataError):
    """A well-formed row of a shape vlgrpo does not train on. Always skipped (never fatal) and reported by row;
    `reason` (several_turns, several_videos, no_image, remote_image, no_gold_box) groups the report."""

    def __init__(self, source: str, row: int | None, field: str | None, reason: str, problem: str):
        self.reason = reason
        super().__init__(source, row, field, f"skipped ({reason}): {problem}")


@dataclass
class ConversionReport:
    """What a preset decided over one file, beyond the rows it skipped (those are in LoadResult.errors)."""

    preset: str
    rows: int = 0
    not_inferred: list[int] = field(default_factory=list)
    """Rows left as answer_type text: the answer is no number, option letter the question lists, yes/no, math
    expression or box."""
    boxes: Counter = field(default_factory=Counter)
    """The box convention each box row was read in -> rows."""
    notes: Counter = field(default_factory=Counter)
    """Other rewrites -> rows (instructions removed from questions, boxes clamped to the image)."""


@dataclass
class Row:
    """The raw row being converted: where it is (for errors) and the report it counts into."""

    source: str
    no: int
    base: Path | None
    report: ConversionReport

    def error(self, fld: str | None, problem: str) -> DataError:
        return DataError(self.source, self.no, fld, problem)

    def skip(self, fld: str | None, reason: str, problem: str) -> RowSkipped:
        return RowSkipped(self.source, self.no, fld, reason, problem)


# ---------------------------------------------------------------- questions and answers

ANSWER_TAGS = re.compile(r"<answer>(.*?)</answer>", re.S)
_FORMAT_INSTRUCTIONS = (  # what the source projects append to questions; vlgrpo appends its own (data.answer_format)
    re.compile(r"\s*Answer the question using a single word or phrase\.?", re.I),  # LLaVA-1.5 short-answer VQA
    re.compile(r"\s*Answer with the option's letter from the given choices directly\.?", re.I),  # LLaVA-1.5 options
    re.compile(r"(?:^|(?<=[.?!:]))[^.?!:\n]*<(?:think|answer)>.*$", re.M),  # R1-V / Visual-RFT "… in <think> …"
)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_MATH = re.compile(r"\\[a-zA-Z]+|\^|[{}√π]|^[-+]?\d+\s*/\s*\d+$")
_LETTER = re.compile(r"\(?([A-Z])\)?(?:[.:)]\s*.*)?", re.S)
_OPTION = re.compile(r"(?:^|[\s(])([A-Z])[.):]\s", re.M)
HINTS = {"mcq": "choice", "yes_no": "yesno", "math": "math"}
"""VLM-R1's per-row `accu_reward_method` -> answer_type."""


def question_text(text: Any, row: Row, fld: str, images: int = 1, video: bool = False) -> str:
    """The question without answer-format instructions. With one image (and no video) its `<image>` marker is removed
    and the image goes first, as LLaVA itself moves it; with several images or a video the markers stay where they
    place the parts (removed when they all lead in the default order: images, then the video), and their counts must
    match the row's."""
    if not isinstance(text, str) or not text.strip():
        raise row.error(fld, f"needs the question text, got {text!r}")
    n_image, n_video = text.count("<image>"), text.count("<video>")
    if images <= 1 and not video:
        if n_image > 1 or n_video:
            raise row.error(fld, f"{n_image} <image> and {n_video} <video> marker(s) for the row's one image")
        text = re.sub(r"\s*<image>\s*", " ", text)
    elif n_image or n_video:
        if (n_image, n_video) != (images, int(video)):
            raise row.error(
                fld,
                f"{n_image} <image> and {n_video} <video> marker(s) but the row has {images} "
                f"image(s) and {int(video)} video: each marker places one of them",
            )
        leading = re.match(r"(?:\s*<(?:image|video)>)+\s*", text)
        if leading and re.sub(r"\s", "", leading.group()) == "<image>" * images + "<video>" * video:
            text = text[leading.end() :]
    stripped = text
    for pattern in _FORMAT_INSTRUCTIONS:
        stripped = pattern.sub("", stripped)
    if stripped != text:
        row.report.notes["answer-format instruction removed from the question"] += 1
    return stripped.strip()


def infer_answer(answer: str, question: str, hint: str | None = None) -> tuple[str, str] | None:
    """(answer_type, gold) read from a text answer: yes/no, an option letter the question lists ("B", "(B)",
    "B. a cat"), a number ("3", "-2.5", "1,000"), a math expression (LaTeX, "3/4"); None when it is none of these."""
    text = answer.strip()
    low = text.lower().rstrip(".!")
    if low in ("yes", "no"):
        return "yesno", low
    letter = _LETTER.fullmatch(text)
    options = set(_OPTION.findall(question))
    if letter and ((len(options) >= 2 and letter.group(1) in options) or HINTS.get(hint or "") == "choice"):
        return "choice", letter.group(1)
    plain = text.rstrip(".")
    plain = plain.replace(",", "") if _THOUSANDS.fullmatch(plain) else plain
    if _NUMBER.fullmatch(plain):
        return "number", plain
    if _MATH.search(text) or HINTS.get(hint or "") == "math":
        return "math", text
    return None


def _is_box(v: Any) -> bool:
    return (
        isinstance(v, (list, tuple))
        and len(v) == 4
        and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in v)
    )


def parse_box_value(value: Any) -> tuple[list[list[float]], str] | None:
    """Boxes written as [x1, y1, x2, y2], a list of them, or Visual-RFT's [{'Position': [...], 'Confidence': 1}],
    with their scale ('per_mille' for Visual-RFT, else 'auto'); None when the value is not boxes."""
    if isinstance(value, str):
        if not value.strip().startswith(("[", "{")):
            return None
        try:
            value = ast.literal_eval(value.strip())  # JSON lists and Visual-RFT's Python-literal dicts alike
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    value = [value] if isinstance(value, dict) else value
    if not isinstance(value, (list, tuple)) or not value:
        return None
    scale = "auto"
    if all(isinstance(v, dict) and "Position" in v for v in value):
        value, scale = [v["Position"] for v in value], "per_mille"
    value = [value] if _is_box(value) else value
    if not all(_is_box(b) for b in value):
        return None
    return [[float(c) for c in b] for b in value], scale


SCALES = {
    "pixels": "original-image pixels",
    "unit": "normalised [0, 1] of the original image (scaled to pixels)",
    "per_mille": "0-1000 of the original image (Visual-RFT; scaled to pixels)",
}


def to_pixels(boxes: list[list[float]], scale: str, image: Any, size, row: Row) -> tuple[list, tuple | None]:
    """Boxes in original-image pixels, and the image size. 'auto': all coordinates <= 1 mean normalised, else pixels.
    A size the row does not declare is read from the image header (a scaled box needs it; a pixel box's reward
    converts with it). Pixel boxes that overshoot the image by at most 1 px (COCO's x + w + 1) are clamped to it."""
    if scale == "auto":
        scale = "unit" if all(0 <= c <= 1 for b in boxes for c in b) else "pixels"
    size = size or _read_size(image, row)
    if scale != "pixels":
        d = 1.0 if scale == "unit" else 1000.0
        boxes = [[round(c / d * size[i % 2], 2) for i, c in enumerate(b)] for b in boxes]
    else:
        limits = [size[0], size[1], size[0], size[1]]
        clamped = [[min(max(c, 0.0), lim) if -1 <= c <= lim + 1 else c for c, lim in zip(b, limits)] for b in boxes]
        if clamped != boxes:
            row.report.notes["box clamped to the image (it overshot by at most 1 px)"] += 1
        boxes = clamped
    row.report.boxes[SCALES[scale]] += 1
    return boxes, size


def gold_fields(solution: Any, question: str, row: Row, fld: str, images: list, size=None, hint=None) -> dict[str, Any]:
    """answer / answer_type (or boxes / image_size) of a row from its solution: text, a number or boxes; text in
    `<answer>…</answer>` is unwrapped first. A box answer needs the row to have exactly one image: the source
    projects' boxes do not say which of several images they lie in."""
    if isinstance(solution, str):
        tagged = ANSWER_TAGS.search(solution)
        solution = tagged.group(1).strip() if tagged else solution.strip()
    parsed = parse_box_value(solution)
    if parsed:
        if len(images) != 1:
            raise row.error(
                fld,
                f"a box answer on a row with {len(images)} images does not say which image it lies "
                'in: write such rows in vlgrpo\'s schema, each box as {"image": i, "box": [x1, y1, x2, '
                "y2]} (i: 0-based index in `images`)",
            )
        boxes, size = to_pixels(*parsed, images[0], size, row)
        return {"answer_type": "box", "boxes": boxes, "image_size": list(size) if size else None}
    if isinstance(solution, bool) or not isinstance(solution, (str, int, float)) or solution == "":
        raise row.error(fld, f"needs a gold answer (text, a number or an [x1, y1, x2, y2] box), got {solution!r}")
    if str(solution).strip().lower() == "no objects":  # Visual-RFT's detection rows without any object
        raise row.skip(fld, "no_gold_box", "'No Objects': a box row needs at least one gold box")
    inferred = infer_answer(str(solution), question, hint)
    if inferred is None:
        row.report.not_inferred.append(row.no)
        inferred = ("text", str(solution).strip())
    return {"answer_type": inferred[0], "answer": inferred[1], "image_size": list(size) if size else None}


# ---------------------------------------------------------------- images


def _no_image(value: Any) -> bool:
    return value in (None, "") or (isinstance(value, dict) and not (value.get("bytes") or value.get("path")))


def image_list(value: Any, row: Row, fld: str) -> list:
    """The row's images (paths, bytes, HF image dicts or decoded images), in order: a list, or one image alone."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) > 1 and any(_no_image(v) for v in values):
        raise row.error(fld, f"an empty entry among the row's {len(values)} images")
    return [v for v in values if not _no_image(v)]


def one_video(videos: Any, row: Row, fld: str) -> Any:
    """The video of a row's list of videos (EasyR1's and TRL's `videos`: each a file or a list of frame images), None
    when the list is empty; RowSkipped for several."""
    videos = [v for v in (videos if isinstance(videos, (list, tuple)) else [videos]) if v not in (None, "", [])]
    if len(videos) > 1:
        raise row.skip(fld, "several_videos", f"{len(videos)} videos; vlgrpo takes one video per row")
    return videos[0] if videos else None


def visual_fields(images: list, video: Any, row: Row, fld: str) -> dict[str, Any]:
    """The schema's `image` (one image), `images` (several) and `video` of a converted row; RowSkipped without any."""
    if not images and video is None:
        raise row.skip(fld, "no_image", "no image or video; vlgrpo trains on questions about images or a video")
    out: dict[str, Any] = {"image": images[0]} if len(images) == 1 else ({"images": images} if images else {})
    return {**out, "video": video} if video is not None else out


def _read_size(image: Any, row: Row) -> tuple[int, int]:
    """(width, height) of the row's image after EXIF rotation, from its header (no full decode)."""
    if hasattr(image, "size") and hasattr(image, "save"):  # a decoded PIL image from an HF dataset
        return tuple(image.size)
    if isinstance(image, dict):
        image = image.get("bytes") or image.get("path")
    if isinstance(image, str) and row.base is not None and not Path(image).is_absolute():
        image = str(row.base / image)
    if not isinstance(image, (str, bytes, bytearray)) or not image:
        raise row.error("image", f"a box row needs its image (boxes are read against its size), got {image!r}")
    try:
        return image_size(image)
    except ImageError as e:
        where = image if isinstance(image, str) else f"<{len(image)} bytes>"
        problem = (
            f"the row declares no image size and it cannot be read from the image: {e}; fix the path (or "
            "--image-root), or give the row's width and height"
        )
        raise ImageUnusable(row.source, row.no, where, problem) from None


def url_image(url: Any, row: Row, fld: str) -> Any:
    """An OpenAI `image_url`: a base64 data URL becomes bytes, a file path stays a path, a web URL is skipped."""
    url = url.get("url") if isinstance(url, dict) else url
    if not isinstance(url, str) or not url:
        raise row.error(fld, f"image_url needs a 'url', got {url!r}")
    if url.startswith("data:"):
        try:
            return base64.b64decode(url.split(",", 1)[1], validate=True)
        except (IndexError, ValueError):
            raise row.error(fld, "image_url is a data URL without valid base64 data") from None
    if url.startswith(("http://", "https://")):
        raise row.skip(fld, "remote_image", f"image at {url[:80]}: download it and give its path")
    return url.removeprefix("file://")


def declared_size(raw: dict) -> tuple[int, int] | None:
    w, h = raw.get("width"), raw.get("height")
    return (w, h) if isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0 else None


def extras(raw: dict, used: Iterable[str]) -> dict[str, Any]:
    """The row's other scalar fields, kept under meta (lists and images are dropped)."""
    return {k: v for k, v in raw.items() if k not in used and isinstance(v, (str, int, float, bool))}


LABEL_FILES = ("labels.jsonl", "labels.csv")
"""An image folder's labels file (vlgrpo.data.adapters reads it): its rows are named after the folder."""


def id_prefix(source: str) -> str:
    """What a generated id starts with: the source's file stem (`train` for data/train.jsonl; an image folder's name;
    `name[split]` for a split of a saved DatasetDict), so rows without ids in separately converted splits differ."""
    path = Path(source)
    stem = path.parent.name if path.name in LABEL_FILES else path.stem
    return re.sub(r"[^\w.\-\[\]]+", "_", stem).strip("_") or "row"


def row_id(raw: dict, row: Row) -> str | int:
    """The id the row declares, as it is; else `<source stem>-<row number>` (`train-17`), unique across files."""
    rid = raw.get("id")
    if isinstance(rid, (str, int)) and not isinstance(rid, bool) and rid != "":
        return rid
    return f"{id_prefix(row.source)}-{row.no}"
