"""Presets: rows in the shapes other VLM-RL projects publish (LLaVA conversations, chat messages, R1-V problem /
solution, EasyR1 parquet, DeepEyes' verl parquet), rewritten into vlgrpo's row schema before
`schema.sample_from_dict` checks them.

`vlgrpo.registry.DATA_PRESET` names each converter here: the config's choices, the CLI's and `load_samples(preset=...)`
read it. A converter returns a schema row (one image, several, a video), or raises RowSkipped (a row vlgrpo cannot
take: several turns, several videos, no image) or DataError (a malformed row); the fields are read by
`preset_fields.py`. Each converter also names
the raw fields of its shape (`@shape`), from which a row given without its preset is told which one reads it.
Knows nothing of models.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from itertools import takewhile
from pathlib import Path
from typing import Any

from vlgrpo.data.preset_fields import (
    ANSWER_TAGS,
    ConversionReport,
    Row,
    declared_size,
    extras,
    gold_fields,
    image_list,
    infer_answer,
    one_video,
    parse_box_value,
    question_text,
    row_id,
    to_pixels,
    url_image,
    visual_fields,
)
from vlgrpo.data.schema import FIELDS, DataError
from vlgrpo.registry import DATA_PRESET
from vlgrpo.types import InputError

# ---------------------------------------------------------------- the presets


def shape(*alternatives: tuple[str, ...]) -> Callable:
    """Mark a converter with the raw fields a row of its shape has: a row has all the fields of one alternative.
    `matching_presets` reads them (through DATA_PRESET), so they are written once, next to the code that reads them."""

    def mark(convert: Callable) -> Callable:
        convert.shapes = alternatives  # type: ignore[attr-defined]
        return convert

    return mark


ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


@shape(("image", "conversations"), ("video", "conversations"))
def llava(raw: dict, row: Row) -> dict[str, Any]:
    """LLaVA `conversations`: one human turn with `<image>` (or `<video>`), one gpt turn (LLaVA-1.5 JSON, VLM-R1
    JSONL with `image` a path or a list of them, LLaVA-Video with `video`)."""
    images, video = image_list(raw.get("image"), row, "image"), raw.get("video") or None
    visual = visual_fields(images, video, row, "image")
    turns = [t for t in raw.get("conversations") or [] if isinstance(t, dict) and t.get("from") != "system"]
    if [ROLES.get(t.get("from")) for t in turns[:2]] != ["user", "assistant"]:
        raise row.error(
            "conversations",
            "needs a list of turns {'from': 'human' | 'gpt', 'value': text}, human "
            f"first, got {raw.get('conversations')!r:.120}",
        )
    if len(turns) > 2:
        raise row.skip("conversations", "several_turns", f"{len(turns)} turns; vlgrpo trains on one question")
    question = question_text(turns[0].get("value"), row, "conversations", len(images), video is not None)
    size = declared_size(raw) if len(images) == 1 else None
    gold = gold_fields(
        turns[1].get("value"), question, row, "conversations", images, size, raw.get("accu_reward_method")
    )
    meta = extras(raw, ("id", "image", "video", "conversations", "width", "height"))
    return {"id": row_id(raw, row), **visual, "question": question, **gold, "meta": meta}


def _parts(message: dict, row: Row, fld: str) -> list[tuple[str, Any]]:
    """A message's content as ("text", str) / ("image", value or None) / ("video", value or None) parts."""
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
            parts.append(("image", url_image(part.get("image_url"), row, fld)))
        elif kind == "video":  # qwen-vl-utils: {"type": "video", "video": a file or a list of frames}; TRL: the row's
            parts.append(("video", part.get("video") or part.get("path")))  # videos
        else:
            raise row.error(fld, f"content part {part!r:.80} is not text, image, image_url or video")
    return parts


def _user_text(parts: list[tuple[str, Any]]) -> str:
    """The user messages' text with an `<image>` / `<video>` marker where each visual part stands (text parts joined
    by newlines); `question_text` drops the markers when the parts all lead."""
    out, last = [], None
    for kind, value in parts:
        out.append(("\n" if kind == last == "text" else "") + (value if kind == "text" else f"<{kind}>"))
        last = kind
    return "".join(out)


def _inline_or_column(inline: list, column: Any, row: Row, fld: str, kind: str) -> list:
    """The values of a message's `kind` parts: given inline, else the row's column (TRL), one per part."""
    column = list(column) if isinstance(column, (list, tuple)) else ([] if column in (None, "") else [column])
    if inline and all(v is not None for v in inline):
        return inline
    if inline and len(column) != len(inline):
        raise row.error(
            fld,
            f"{len(inline)} {kind} part(s) without their {kind} inline, but the row's {kind}s "
            f"column holds {len(column)}",
        )
    return column


@shape(("messages",), ("prompt", "completion"))
def messages(raw: dict, row: Row) -> dict[str, Any]:
    """Chat `messages` (TRL, OpenAI; or TRL's `prompt` + `completion`) with text, image and video parts.

    Images are inline (`image`, `image_url`) or in the row's `images` / `image`, a video inline (`video`) or in
    `videos` / `video`; the answer is the assistant message, else the row's `answer` or `solution`."""
    key = "messages" if "messages" in raw else "prompt"
    msgs = list(raw.get(key) or []) + (list(raw.get("completion") or []) if key == "prompt" else [])
    if not msgs or not all(isinstance(m, dict) and isinstance(m.get("content"), (str, list)) for m in msgs):
        raise row.error(key, "needs a list of messages {'role': ..., 'content': text or a list of parts}")
    system = [p for m in msgs if m.get("role") == "system" for kind, p in _parts(m, row, key) if kind == "text"]
    chat = [m for m in msgs if m.get("role") != "system"]
    users = list(takewhile(lambda m: m.get("role") == "user", chat))
    replies = chat[len(users) :]
    if not users or (replies and replies[0].get("role") != "assistant"):
        roles = [m.get("role") for m in msgs]
        raise row.error(key, f"needs user message(s) then one assistant message, got roles {roles}")
    if len(replies) > 1:
        raise row.skip(key, "several_turns", f"{len(chat)} messages; vlgrpo trains on one question")
    parts = [p for m in users for p in _parts(m, row, key)]
    column = raw.get("images") if raw.get("images") is not None else raw.get("image")
    images = image_list(_inline_or_column([v for k, v in parts if k == "image"], column, row, key, "image"), row, key)
    videos = raw.get("videos") if raw.get("videos") is not None else [raw.get("video")]  # `video`: one video
    video = one_video(_inline_or_column([v for k, v in parts if k == "video"], videos, row, key, "video"), row, key)
    visual = visual_fields(images, video, row, key)
    question = question_text(_user_text(parts), row, key, len(images), video is not None)
    answer = " ".join(p for kind, p in _parts(replies[0], row, key) if kind == "text") if replies else None
    answer = answer if answer is not None else raw.get("answer", raw.get("solution"))
    gold = gold_fields(answer, question, row, key, images)
    meta = extras(raw, ("id", key, "completion", "images", "image", "videos", "video", "answer", "solution"))
    meta.update({"system": "\n".join(system)} if system else {})
    return {"id": row_id(raw, row), **visual, "question": question, **gold, "meta": meta}


@shape(("image", "problem", "solution"))
def r1v(raw: dict, row: Row) -> dict[str, Any]:
    """R1-V / VLM-R1 / Visual-RFT: `image` (a path, or a list of them), `problem`, `solution` (text in <answer>
    tags, or boxes).

    A box is VLM-R1's [x1, y1, x2, y2] in original pixels (all coordinates <= 1: normalised), or Visual-RFT's
    `<answer>[{'Position': [...], 'Confidence': 1}]</answer>` on its 0-1000 scale."""
    images = image_list(raw.get("image"), row, "image")
    visual = visual_fields(images, None, row, "image")
    question = question_text(raw.get("problem"), row, "problem", len(images))
    size = declared_size(raw) if len(images) == 1 else None
    gold = gold_fields(raw.get("solution"), question, row, "solution", images, size, raw.get("accu_reward_method"))
    meta = extras(raw, ("id", "image", "problem", "solution", "width", "height"))
    return {"id": row_id(raw, row), **visual, "question": question, **gold, "meta": meta}


@shape(("images", "problem", "answer"), ("videos", "problem", "answer"))
def easyr1(raw: dict, row: Row) -> dict[str, Any]:
    """EasyR1: `images` (a list) and / or `videos` (a list of one: a file or a list of frames), `problem` (with
    `<image>` / `<video>` markers), `answer`."""
    images = image_list(raw.get("images"), row, "images")
    video = one_video(raw.get("videos"), row, "videos")
    visual = visual_fields(images, video, row, "images")
    question = question_text(raw.get("problem"), row, "problem", len(images), video is not None)
    gold = gold_fields(raw.get("answer"), question, row, "answer", images)
    meta = extras(raw, ("id", "images", "videos", "problem", "answer"))
    return {"id": row_id(raw, row), **visual, "question": question, **gold, "meta": meta}


DEEPEYES_MATH_SOURCES = ("thinklite_eureka", "xince")
"""DeepEyes' data_source values scored by math_verify then a judge (verl/utils/reward_score/__init__.py); the other
sources (vstar, vl_agent, chart) by a judge model alone: free-form answers."""
_DEEPEYES_INSTRUCTION = re.compile(r"\s*Think first, call \*\*image_zoom_in_tool\*\* if needed.*$", re.S)
"""DeepEyes' user-turn instruction (PROMPT.USER_PROMPT_V2); vlgrpo appends its own (data.answer_format)."""


@shape(("data_source", "prompt", "images", "reward_model"))
def deepeyes(raw: dict, row: Row) -> dict[str, Any]:
    """DeepEyes-47k (ChenShawn/DeepEyes-Datasets-47k; verl's RL parquet rows as Visual-Agent/DeepEyes reads them):
    `prompt` (chat messages: DeepEyes' tool-describing system turn, one user turn with `<image>`), `images` ({'bytes':
    ...} or paths), `reward_model.ground_truth`, `extra_info.question` (the question its judge reward reads),
    `data_source`, `env_name` (visual_toolbox_v2: a row its rollout let call the zoom tool), `ability`.

    The question is `extra_info.question`, else the user turn without `<image>` and DeepEyes' format instruction; the
    gold answer's type is inferred as every preset's (a number, an option letter the question lists, yes/no, LaTeX,
    else text), math for the math sources (DEEPEYES_MATH_SOURCES). Text golds are mostly sentences ("The cup is on the
    left."): score them with the judge reward (reward.judge), as DeepEyes does."""
    msgs = raw.get("prompt")
    if not isinstance(msgs, (list, tuple)) or not all(isinstance(m, dict) for m in msgs):
        raise row.error("prompt", f"needs a list of chat messages {{'role', 'content'}}, got {msgs!r:.120}")
    users = [m for m in msgs if m.get("role") == "user"]
    if any(m.get("role") not in ("system", "user") for m in msgs) or len(users) > 1:
        raise row.skip("prompt", "several_turns", f"roles {[m.get('role') for m in msgs]}; vlgrpo takes one question")
    if not users:
        raise row.error("prompt", f"has no user message, roles {[m.get('role') for m in msgs]}")
    images = image_list(raw.get("images"), row, "images")
    visual = visual_fields(images, None, row, "images")
    info = raw.get("extra_info") if isinstance(raw.get("extra_info"), dict) else {}
    asked = info.get("question") if isinstance(info.get("question"), str) and info["question"].strip() else None
    text = asked or _DEEPEYES_INSTRUCTION.sub("", _user_text(_parts(users[0], row, "prompt")))
    question = question_text(text, row, "extra_info" if asked else "prompt", len(images))
    gold = _deepeyes_gold(raw, question, row)
    system = [p for m in msgs if m.get("role") == "system" for kind, p in _parts(m, row, "prompt") if kind == "text"]
    meta = extras(raw, ("id", "prompt", "images", "reward_model", "extra_info"))
    meta.update({"extra_info": extras(info, ())} if info else {})
    meta.update({"system": "\n".join(system)} if system else {})
    return {"id": row_id(raw, row), **visual, "question": question, **gold, "meta": meta}


def _deepeyes_gold(raw: dict, question: str, row: Row) -> dict[str, Any]:
    """answer / answer_type from `reward_model.ground_truth` (never a box: DeepEyes' answers are text)."""
    truth = (raw.get("reward_model") or {}).get("ground_truth") if isinstance(raw.get("reward_model"), dict) else None
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)) or not str(truth).strip():
        raise row.error("reward_model", f"needs ground_truth (the gold answer), got {raw.get('reward_model')!r:.120}")
    hint = "math" if raw.get("data_source") in DEEPEYES_MATH_SOURCES else None
    inferred = infer_answer(str(truth), question, hint)
    if inferred is None:
        row.report.not_inferred.append(row.no)
        inferred = ("text", str(truth).strip())
    return {"answer_type": inferred[0], "answer": inferred[1]}


def _schema_row(raw: dict, row: Row) -> dict[str, Any]:
    """`columns` without a preset: the renamed row is in the schema's names; infer what a preset would."""
    out = {k: v for k, v in raw.items() if k in FIELDS}
    out["id"], out["meta"] = row_id(out, row), {**extras(raw, FIELDS), **(out.get("meta") or {})}
    if isinstance(out.get("image"), (list, tuple)):  # a list under `image`: one image, or the schema's `images`
        images = image_list(out.pop("image"), row, "image")
        out.update({"image": images[0]} if len(images) == 1 else {"images": images})
    n_images = len(out["images"]) if isinstance(out.get("images"), (list, tuple)) else int(out.get("image") is not None)
    if isinstance(out.get("question"), str):
        out["question"] = question_text(out["question"], row, "question", n_images, out.get("video") is not None)
    size = out.get("image_size")
    if n_images == 1 and parse_box_value(out.get("boxes") or None):  # boxes given: only their scale is decided
        out["boxes"], size = to_pixels(*parse_box_value(out["boxes"]), out.get("image"), size, row)
        out["image_size"], out["answer_type"] = (list(size) if size else None), out.get("answer_type") or "box"
    elif out.get("answer") is not None and not out.get("answer_type"):
        images = [out["image"]] if n_images == 1 and "image" in out else list(out.get("images") or [])
        out.update(gold_fields(out["answer"], out.get("question") or "", row, "answer", images, size))
    elif isinstance(out.get("answer"), str):
        tagged = ANSWER_TAGS.search(out["answer"])
        out["answer"] = tagged.group(1).strip() if tagged else out["answer"]
    return out


PRESETS = tuple(name for name in DATA_PRESET.names if name != "none")
"""The presets (vlgrpo.registry.DATA_PRESET names each converter)."""


def matching_presets(keys: Iterable[str]) -> list[str]:
    """The presets (DATA_PRESET's order) whose shape a raw row with these keys has, e.g. ['r1v'] for image, problem,
    solution; [] for a vlgrpo row or a shape no preset reads."""
    have = set(keys)
    return [name for name in PRESETS if any(set(fields) <= have for fields in DATA_PRESET.load(name).shapes)]


def with_preset_hint(error: DataError, raw: Any) -> DataError:
    """`error` (a row that fails the schema) naming the preset that reads the row, when its fields are one's shape:
    "unknown field 'problem'" alone does not say that `--preset r1v` reads the file."""
    names = matching_presets(raw) if isinstance(raw, dict) else []
    if not names:
        return error
    hint = (
        f"; the row looks like the {' or '.join(names)} preset: run with --preset {names[0]}, or set "
        f"data.preset: {names[0]} in the config"
    )
    return DataError(error.source, error.row, error.field, error.problem + hint)


def parse_columns(text: str) -> dict[str, str]:
    """'question=problem,answer=solution' -> {'question': 'problem', 'answer': 'solution'} (target=source)."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    bad = [("=".join(p)) for p in pairs if len(p) != 2 or not p[0].strip() or not p[1].strip()]
    if bad or not pairs:
        raise InputError(f"--columns {text!r}: give target=source pairs, e.g. question=problem,answer=solution")
    return {k.strip(): v.strip() for k, v in pairs}


def convert_rows(
    rows: Iterable[tuple[int, Any]],
    preset: str,
    columns: dict[str, str],
    source: str,
    base: Path | None,
    report: ConversionReport,
) -> Iterator[tuple[int, Any]]:
    """Rename `columns` ({target: source}) in each raw row, then apply the preset ("none": the targets are row
    fields). Yields (row number, schema row or DataError). A bad preset or mapping fails before any row is read."""
    if preset not in DATA_PRESET.names:
        raise DataError(
            source, None, None, f"data.preset '{preset}' is not accepted; use one of: none, {', '.join(PRESETS)}"
        )
    if preset == "none" and set(columns) - set(FIELDS):
        raise DataError(
            source,
            None,
            None,
            f"data.columns maps onto {sorted(set(columns) - set(FIELDS))}, which are "
            f"not row fields ({', '.join(FIELDS)}); with a preset, map onto its input columns",
        )
    convert = DATA_PRESET.load(preset) if preset != "none" else _schema_row
    for no, raw in rows:
        if isinstance(raw, DataError):
            yield no, raw
            continue
        report.rows += 1
        row = Row(source, no, base, report)
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
