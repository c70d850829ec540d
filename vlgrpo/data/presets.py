"""Presets: rows in the shapes other VLM-RL projects publish (LLaVA conversations, chat messages, R1-V problem /
solution, EasyR1 parquet), rewritten into vlgrpo's row schema before `schema.sample_from_dict` checks them.

`vlgrpo.registry.DATA_PRESET` names each converter here: the config's choices, the CLI's and `load_samples(preset=...)`
read it. A converter returns a schema row,
or raises RowSkipped (a row vlgrpo cannot train on: several images, several turns, no image) or DataError (a
malformed row). Knows nothing of models; it opens an image header only to scale a normalised box to pixels.
"""

from __future__ import annotations

import ast
import base64
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import takewhile
from pathlib import Path
from typing import Any, Iterable, Iterator

from vlgrpo.data.images import ImageError, image_size
from vlgrpo.data.schema import FIELDS, DataError
from vlgrpo.registry import DATA_PRESET
from vlgrpo.types import InputError


class RowSkipped(DataError):
    """A well-formed row of a shape vlgrpo does not train on. Always skipped (never fatal) and reported by row;
    `reason` (several_images, several_turns, no_image, remote_image, no_gold_box) groups the report."""

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
class _Row:
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

_ANSWER_TAGS = re.compile(r"<answer>(.*?)</answer>", re.S)
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


def _question(text: Any, row: _Row, fld: str) -> tuple[str, int]:
    """The question without `<image>` markers or answer-format instructions, and how many markers it had (more than
    one: RowSkipped)."""
    if not isinstance(text, str) or not text.strip():
        raise row.error(fld, f"needs the question text, got {text!r}")
    markers = text.count("<image>")
    if markers > 1:
        raise row.skip(fld, "several_images", f"{markers} <image> markers in the question")
    text = re.sub(r"\s*<image>\s*", " ", text)
    stripped = text
    for pattern in _FORMAT_INSTRUCTIONS:
        stripped = pattern.sub("", stripped)
    if stripped != text:
        row.report.notes["answer-format instruction removed from the question"] += 1
    return stripped.strip(), markers


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
    return isinstance(v, (list, tuple)) and len(v) == 4 and all(
        isinstance(c, (int, float)) and not isinstance(c, bool) for c in v)  # fmt: skip


def _parse_boxes(value: Any) -> tuple[list[list[float]], str] | None:
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


SCALES = {"pixels": "original-image pixels", "unit": "normalised [0, 1] of the original image (scaled to pixels)",
          "per_mille": "0-1000 of the original image (Visual-RFT; scaled to pixels)"}  # fmt: skip


def _to_pixels(boxes: list[list[float]], scale: str, image: Any, size, row: _Row) -> tuple[list, tuple | None]:
    """Boxes in original-image pixels. 'auto': all coordinates <= 1 mean normalised, else pixels. Pixel boxes that
    overshoot the declared image by at most 1 px (COCO's x + w + 1) are clamped to it."""
    if scale == "auto":
        scale = "unit" if all(0 <= c <= 1 for b in boxes for c in b) else "pixels"
    if scale != "pixels":
        size = size or _read_size(image, row)
        d = 1.0 if scale == "unit" else 1000.0
        boxes = [[round(c / d * size[i % 2], 2) for i, c in enumerate(b)] for b in boxes]
    elif size is not None:
        limits = [size[0], size[1], size[0], size[1]]
        clamped = [[min(max(c, 0.0), lim) if -1 <= c <= lim + 1 else c for c, lim in zip(b, limits)] for b in boxes]
        if clamped != boxes:
            row.report.notes["box clamped to the image (it overshot by at most 1 px)"] += 1
        boxes = clamped
    row.report.boxes[SCALES[scale]] += 1
    return boxes, size


def _gold(solution: Any, question: str, row: _Row, fld: str, image: Any, size=None, hint=None) -> dict[str, Any]:
    """answer / answer_type (or boxes / image_size) of a row from its solution: text, a number or boxes; text in
    `<answer>…</answer>` is unwrapped first."""
    if isinstance(solution, str):
        tagged = _ANSWER_TAGS.search(solution)
        solution = tagged.group(1).strip() if tagged else solution.strip()
    parsed = _parse_boxes(solution)
    if parsed:
        boxes, size = _to_pixels(*parsed, image, size, row)
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


def _one_image(value: Any, row: _Row, fld: str) -> Any:
    """The row's single image (path, bytes, HF image dict or decoded image); RowSkipped for none or several."""
    if isinstance(value, (list, tuple)):
        if len(value) > 1:
            raise row.skip(fld, "several_images", f"{len(value)} images; vlgrpo trains on one image per row")
        value = value[0] if value else None
    if value in (None, "") or (isinstance(value, dict) and not (value.get("bytes") or value.get("path"))):
        raise row.skip(fld, "no_image", "no image; vlgrpo trains on questions about one image")
    return value


def _read_size(image: Any, row: _Row) -> tuple[int, int]:
    if hasattr(image, "size") and hasattr(image, "save"):  # a decoded PIL image from an HF dataset
        return tuple(image.size)
    if isinstance(image, dict):
        image = image.get("bytes") or image.get("path")
    if isinstance(image, str) and row.base is not None and not Path(image).is_absolute():
        image = str(row.base / image)
    try:
        return image_size(image)
    except ImageError as e:
        raise row.error("image", f"a normalised box is scaled by the image size, which cannot be read: {e}") from None


def _url_image(url: Any, row: _Row, fld: str) -> Any:
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


def _declared_size(raw: dict) -> tuple[int, int] | None:
    w, h = raw.get("width"), raw.get("height")
    return (w, h) if isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0 else None


def _extras(raw: dict, used: Iterable[str]) -> dict[str, Any]:
    """The row's other scalar fields, kept under meta (lists and images are dropped)."""
    return {k: v for k, v in raw.items() if k not in used and isinstance(v, (str, int, float, bool))}


def _row_id(raw: dict, row: _Row) -> str | int:
    rid = raw.get("id")
    return rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) and rid != "" else row.no


# ---------------------------------------------------------------- the presets

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


def llava(raw: dict, row: _Row) -> dict[str, Any]:
    """LLaVA `conversations`: one human turn with `<image>`, one gpt turn (LLaVA-1.5 JSON, VLM-R1 JSONL)."""
    image = _one_image(raw.get("image"), row, "image")
    turns = [t for t in raw.get("conversations") or [] if isinstance(t, dict) and t.get("from") != "system"]
    if [ROLES.get(t.get("from")) for t in turns[:2]] != ["user", "assistant"]:
        raise row.error("conversations", "needs a list of turns {'from': 'human' | 'gpt', 'value': text}, human "
                        f"first, got {raw.get('conversations')!r:.120}")  # fmt: skip
    if len(turns) > 2:
        raise row.skip("conversations", "several_turns", f"{len(turns)} turns; vlgrpo trains on one question")
    question, _ = _question(turns[0].get("value"), row, "conversations")
    gold = _gold(turns[1].get("value"), question, row, "conversations", image, _declared_size(raw),
                 raw.get("accu_reward_method"))  # fmt: skip
    meta = _extras(raw, ("id", "image", "conversations", "width", "height"))
    return {"id": _row_id(raw, row), "image": image, "question": question, **gold, "meta": meta}


def _parts(message: dict, row: _Row, fld: str) -> list[tuple[str, Any]]:
    """A message's content as ("text", str) / ("image", value or None) parts."""
    content = message.get("content")
    if isinstance(content, str):
        return [("text", content)]
    parts = []
    for part in content or []:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append(("text", part.get("text") or ""))
        elif kind == "image":  # TRL: {"type": "image"} with the image in the row's images, or inline
            parts.append(("image", part.get("image") or part.get("path") or part.get("url")))
        elif kind == "image_url":  # OpenAI
            parts.append(("image", _url_image(part.get("image_url"), row, fld)))
        else:
            raise row.error(fld, f"content part {part!r:.80} is not text, image or image_url")
    return parts


def messages(raw: dict, row: _Row) -> dict[str, Any]:
    """Chat `messages` (TRL, OpenAI; or TRL's `prompt` + `completion`) with text and image parts.

    The image is inline (`image`, `image_url`) or in the row's `images` / `image`; the answer is the assistant
    message, else the row's `answer` or `solution`."""
    key = "messages" if "messages" in raw else "prompt"
    msgs = list(raw.get(key) or []) + (list(raw.get("completion") or []) if key == "prompt" else [])
    if not msgs or not all(isinstance(m, dict) and isinstance(m.get("content"), (str, list)) for m in msgs):
        raise row.error(key, "needs a list of messages {'role': ..., 'content': text or a list of parts}")
    system = [p for m in msgs if m.get("role") == "system" for kind, p in _parts(m, row, key) if kind == "text"]
    chat = [m for m in msgs if m.get("role") != "system"]
    users = list(takewhile(lambda m: m.get("role") == "user", chat))
    replies = chat[len(users):]
    if not users or (replies and replies[0].get("role") != "assistant"):
        roles = [m.get("role") for m in msgs]
        raise row.error(key, f"needs user message(s) then one assistant message, got roles {roles}")
    if len(replies) > 1:
        raise row.skip(key, "several_turns", f"{len(chat)} messages; vlgrpo trains on one question")
    parts = [p for m in users for p in _parts(m, row, key)]
    question, markers = _question("\n".join(p for kind, p in parts if kind == "text"), row, key)
    inline = [p for kind, p in parts if kind == "image"]
    column = raw.get("images") if raw.get("images") is not None else raw.get("image")
    column = list(column) if isinstance(column, (list, tuple)) else ([] if column is None else [column])
    if len(inline) + markers > 1 or len(column) > 1:
        raise row.skip(key, "several_images", f"{max(len(inline) + markers, len(column))} images in one row")
    given = [p for p in inline if p is not None]
    image = _one_image(given or column, row, key)
    answer = " ".join(p for kind, p in _parts(replies[0], row, key) if kind == "text") if replies else None
    answer = answer if answer is not None else raw.get("answer", raw.get("solution"))
    gold = _gold(answer, question, row, key, image)
    meta = _extras(raw, ("id", key, "completion", "images", "image", "answer", "solution"))
    meta.update({"system": "\n".join(system)} if system else {})
    return {"id": _row_id(raw, row), "image": image, "question": question, **gold, "meta": meta}


def r1v(raw: dict, row: _Row) -> dict[str, Any]:
    """R1-V / VLM-R1 / Visual-RFT: `image`, `problem`, `solution` (text in <answer> tags, or boxes).

    A box is VLM-R1's [x1, y1, x2, y2] in original pixels (all coordinates <= 1: normalised), or Visual-RFT's
    `<answer>[{'Position': [...], 'Confidence': 1}]</answer>` on its 0-1000 scale."""
    image = _one_image(raw.get("image"), row, "image")
    question, _ = _question(raw.get("problem"), row, "problem")
    gold = _gold(raw.get("solution"), question, row, "solution", image, _declared_size(raw),
                 raw.get("accu_reward_method"))  # fmt: skip
    meta = _extras(raw, ("id", "image", "problem", "solution", "width", "height"))
    return {"id": _row_id(raw, row), "image": image, "question": question, **gold, "meta": meta}


def easyr1(raw: dict, row: _Row) -> dict[str, Any]:
    """EasyR1: `images` (a list), `problem` (with `<image>`), `answer`."""
    image = _one_image(raw.get("images"), row, "images")
    question, _ = _question(raw.get("problem"), row, "problem")
    gold = _gold(raw.get("answer"), question, row, "answer", image)
    meta = _extras(raw, ("id", "images", "problem", "answer"))
    return {"id": _row_id(raw, row), "image": image, "question": question, **gold, "meta": meta}


def _schema_row(raw: dict, row: _Row) -> dict[str, Any]:
    """`columns` without a preset: the renamed row is in the schema's names; infer what a preset would."""
    out = {k: v for k, v in raw.items() if k in FIELDS}
    out["id"], out["meta"] = _row_id(out, row), {**_extras(raw, FIELDS), **(out.get("meta") or {})}
    if isinstance(out.get("image"), (list, tuple)):
        out["image"] = _one_image(out["image"], row, "image")
    if isinstance(out.get("question"), str):
        out["question"], _ = _question(out["question"], row, "question")
    size = out.get("image_size")
    if _parse_boxes(out.get("boxes") or None):  # boxes given: only their scale is decided (all <= 1: normalised)
        out["boxes"], size = _to_pixels(*_parse_boxes(out["boxes"]), out.get("image"), size, row)
        out["image_size"], out["answer_type"] = (list(size) if size else None), out.get("answer_type") or "box"
    elif out.get("answer") is not None and not out.get("answer_type"):
        out.update(_gold(out["answer"], out.get("question") or "", row, "answer", out.get("image"), size))
    elif isinstance(out.get("answer"), str):
        tagged = _ANSWER_TAGS.search(out["answer"])
        out["answer"] = tagged.group(1).strip() if tagged else out["answer"]
    return out


PRESETS = tuple(name for name in DATA_PRESET.names if name != "none")
"""The presets (vlgrpo.registry.DATA_PRESET names each converter)."""


def parse_columns(text: str) -> dict[str, str]:
    """'question=problem,answer=solution' -> {'question': 'problem', 'answer': 'solution'} (target=source)."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    bad = [("=".join(p)) for p in pairs if len(p) != 2 or not p[0].strip() or not p[1].strip()]
    if bad or not pairs:
        raise InputError(f"--columns {text!r}: give target=source pairs, e.g. question=problem,answer=solution")
    return {k.strip(): v.strip() for k, v in pairs}


def convert_rows(
    rows: Iterable[tuple[int, Any]], preset: str, columns: dict[str, str], source: str, base: Path | None,
    report: ConversionReport,
) -> Iterator[tuple[int, Any]]:  # fmt: skip
    """Rename `columns` ({target: source}) in each raw row, then apply the preset ("none": the targets are row
    fields). Yields (row number, schema row or DataError). A bad preset or mapping fails before any row is read."""
    if preset not in DATA_PRESET.names:
        raise DataError(source, None, None, f"data.preset '{preset}' is not accepted; use one of: none, "
                        f"{', '.join(PRESETS)}")  # fmt: skip
    if preset == "none" and set(columns) - set(FIELDS):
        raise DataError(source, None, None, f"data.columns maps onto {sorted(set(columns) - set(FIELDS))}, which are "
                        f"not row fields ({', '.join(FIELDS)}); with a preset, map onto its input columns")  # fmt: skip
    convert = DATA_PRESET.load(preset) if preset != "none" else _schema_row
    for no, raw in rows:
        if isinstance(raw, DataError):
            yield no, raw
            continue
        report.rows += 1
        row = _Row(source, no, base, report)
        try:
            if not isinstance(raw, dict):
                raise row.error(None, f"each row must be an object, got {type(raw).__name__}")
            missing = [src for src in columns.values() if src not in raw]
            if missing:
                raise row.error(missing[0], f"is mapped by data.columns but missing; the row has {sorted(raw)}")
            renamed = {k: v for k, v in raw.items() if k not in columns.values()}
            renamed.update({target: raw[src] for target, src in columns.items()})
            converted: Any = convert(renamed, row)
        except DataError as e:
            converted = e
        yield no, converted
