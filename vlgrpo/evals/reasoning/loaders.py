"""Loaders for the reasoning benchmarks described in `evals/` (mathvista, geometry3k, superclevr, mmmu) and V* Bench
(vstar): each reads its benchmark's published file as it is - MathVista's testmini.json or parquet, EasyR1's
Geometry3K parquet, R1-V's SuperCLEVR test JSONL, MMMU's per-subject parquet, V*'s folders of annotated images - into
checked Samples whose `meta` keeps the published fields the scorers need (`meta["benchmark"]` names the benchmark).
The file's rows, its benchmark and the sha256 its manifest pins (checked when pinned) come from
`files.py`; here each published row becomes a Sample. Local files only, never downloads; knows nothing of
models or scoring rules.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlgrpo.data.schema import DataError, sample_from_dict
from vlgrpo.evals.benchmarks import check_image_files
from vlgrpo.evals.reasoning.files import (
    PUBLISHED_SPLIT,
    SHAPES,
    Rows,
    benchmark_of,
    pinned_sha256,
    read_rows,
    read_vstar,
    verify_sha256,
)
from vlgrpo.evals.reasoning.score import parse_list
from vlgrpo.rewards.verifiable import parse_number
from vlgrpo.types import InputError, Sample

MAX_MMMU_IMAGES = 7


# ---------------------------------------------------------------- one published row -> one Sample dict


def _need(row: Any, keys: tuple[str, ...], source: str, no: int) -> dict:
    if not isinstance(row, dict):
        raise DataError(source, no, None, f"each row must be an object, got {type(row).__name__}")
    missing = [k for k in keys if row.get(k) is None]
    if missing:
        raise DataError(source, no, missing[0], "is required and missing")
    return row


def _has_image(value: Any) -> bool:
    return bool(value.get("bytes") or value.get("path")) if isinstance(value, dict) else bool(value)


def _letters(n: int) -> list[str]:
    return [chr(ord("A") + i) for i in range(n)]


MATHVISTA_HINTS = {
    "multi_choice": "Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end.",
    "integer": "Please answer the question requiring an integer answer and provide the final value, e.g., 1, 2, 3, at "
    "the end.",
    "float1": "Please answer the question requiring a floating-point number with one decimal place and provide the "
    "final value, e.g., 1.2, 1.3, 1.4, at the end.",
    "float2": "Please answer the question requiring a floating-point number with two decimal places and provide the "
    "final value, e.g., 1.23, 1.34, 1.45, at the end.",
    "list": "Please answer the question requiring a Python list as an answer and provide the final list, e.g., "
    "[1, 2, 3], [1.2, 1.3, 1.4], at the end.",
}
"""MathVista's zero-shot hints (the `query` of its hub copy and data/query.json)."""


def mathvista_query(row: dict) -> str:
    """MathVista's `query` for a row without one (testmini.json has none): hint, question with its unit, choices, as
    in its data/query.json (the same text for all 1,000 testmini rows)."""
    kind = "multi_choice" if row["question_type"] == "multi_choice" else row["answer_type"]
    kind = f"float{row.get('precision') or 1}" if kind == "float" else kind
    lines = [
        f"Hint: {MATHVISTA_HINTS[kind]}",
        f"Question: {row['question']}" + (f" (Unit: {row['unit']})" if row.get("unit") else ""),
    ]
    if row.get("choices"):
        lines += ["Choices:", *(f"({k}) {c}" for k, c in zip(_letters(len(row["choices"])), row["choices"]))]
    return "\n".join(lines).strip()


def _mathvista(row: Any, source: str, no: int) -> dict:
    row = _need(row, SHAPES["mathvista"], source, no)
    qtype, atype, answer, choices = row["question_type"], row["answer_type"], str(row["answer"]), row.get("choices")
    precision = row.get("precision")
    if precision is not None and not (isinstance(precision, float) and math.isnan(precision)):
        precision = int(precision)  # a parquet copy stores it as a float (NaN where there is none)
    else:
        precision = None
    if qtype == "multi_choice":
        if not choices or answer not in choices:
            raise DataError(source, no, "answer", f"{answer!r} is not one of the choices {choices!r}")
        kind, gold = "choice", _letters(len(choices))[choices.index(answer)]
    elif qtype == "free_form" and atype in ("integer", "float", "list", "text"):
        kind, gold = {"integer": "number", "float": "number"}.get(atype, "text"), answer
    else:
        raise DataError(
            source,
            no,
            "question_type",
            f"{qtype!r}/{atype!r} is not multi_choice or free_form with an answer_type of integer, float, list or text",
        )
    meta = row.get("metadata") or {}
    image = row.get("decoded_image") if _has_image(row.get("decoded_image")) else row.get("image")
    query = row.get("query") or mathvista_query({**row, "precision": precision})
    return {
        "id": f"mathvista-{row['pid']}",
        "image": image,
        "question": query + "\n",
        "answer": gold,
        "answer_type": kind,
        "task": "mathvista",
        "meta": {
            "benchmark": "mathvista",
            "pid": str(row["pid"]),
            "question_type": qtype,
            "answer_type": atype,
            "choices": list(choices) if choices else None,
            "precision": precision,
            "unit": row.get("unit"),
            "answer": answer,
            **{k: meta.get(k) for k in ("task", "context", "grade", "source")},
            "skills": list(meta.get("skills") or []),
        },
    }


def _geometry3k(row: Any, source: str, no: int) -> dict:
    row = _need(row, SHAPES["geometry3k"], source, no)
    images = row["images"] if isinstance(row["images"], list) else [row["images"]]
    if not images:
        raise DataError(source, no, "images", "is empty; a Geometry3K row holds its diagram")
    question = str(row["problem"]).replace("<image>", "").strip()  # the images go first, as Qwen places them
    return {
        "id": f"geometry3k-{no}",
        "images": images,
        "question": question,
        "answer": str(row["answer"]).strip(),
        "answer_type": "math",
        "task": "geometry3k",
        "meta": {"benchmark": "geometry3k", "row": no},
    }


def _superclevr(row: Any, source: str, no: int) -> dict:
    row = _need(row, SHAPES["superclevr"], source, no)
    question, gold = row.get("question") or row.get("problem"), row["ground_truth"]
    if not isinstance(question, str):
        raise DataError(source, no, "question", "is required (R1-V's test file has `question`; `problem` also works)")
    if isinstance(gold, bool) or not (isinstance(gold, int) or (isinstance(gold, str) and gold.strip().isdigit())):
        raise DataError(source, no, "ground_truth", f"must be a whole number (a count), got {gold!r}")
    return {
        "id": f"superclevr-{no}",
        "image": row["image_path"],
        "question": question,
        "answer": str(int(gold)),
        "answer_type": "number",
        "task": "superclevr",
        "meta": {"benchmark": "superclevr", "image_path": row["image_path"]},
    }


def mmmu_subject(row_id: str) -> str:
    """The subject of an MMMU id: validation_Art_Theory_12 -> Art_Theory."""
    m = re.fullmatch(r"(?:dev|validation|test)_(.+)_\d+", row_id)
    return m.group(1) if m else ""


def _mmmu(row: Any, source: str, no: int) -> dict:
    row = _need(row, SHAPES["mmmu"], source, no)
    options = row["options"]
    if isinstance(options, str):
        try:
            options = ast.literal_eval(options)
        except (ValueError, SyntaxError):
            options = None
    if not isinstance(options, list):
        raise DataError(source, no, "options", f"must be a list (or its string repr), got {row['options']!r}")
    qtype, answer, question = row.get("question_type") or "multiple-choice", str(row["answer"]), row["question"]
    if qtype == "multiple-choice":
        if answer not in _letters(len(options)):
            raise DataError(source, no, "answer", f"{answer!r} is not an option letter of {len(options)} options")
        lines = "\n".join(f"({k}) {o}" for k, o in zip(_letters(len(options)), options))
        kind, gold, question = "choice", answer, f"{question}\n\n{lines}\n"
    else:
        gold = str((parse_list(answer) or [answer])[0])  # an answer written as a list: vqa compares its first item
        kind = "number" if parse_number(gold) is not None and re.fullmatch(r"[-+\d.,eE]+", gold) else "text"
    images, question = _mmmu_images(row, question, source, no)
    return {
        "id": str(row["id"]),
        "images": images,
        "question": question,
        "answer": gold,
        "answer_type": kind,
        "task": f"mmmu/{mmmu_subject(str(row['id']))}",
        "meta": {
            "benchmark": "mmmu",
            "question_type": qtype,
            "options": options,
            "answer": answer,
            "subject": mmmu_subject(str(row["id"])),
            "subfield": row.get("subfield"),
        },
    }


_MMMU_REF = re.compile(r"<image (\d+)>")


def _mmmu_images(row: dict, question: str, source: str, no: int) -> tuple[list, str]:
    """A row's images in prompt order and its question with `<image>` markers, as lmms-eval prompts MMMU: each
    `<image k>` the question (options included) names is placed where it is first named (a later mention stays as
    the words "image k"); an image the text never names goes first. A named image the row lacks is refused."""
    present = [k for k in range(1, MAX_MMMU_IMAGES + 1) if _has_image(row.get(f"image_{k}"))]
    named = list(dict.fromkeys(int(k) for k in _MMMU_REF.findall(question)))
    missing = [k for k in named if k not in present]
    if missing:
        raise DataError(source, no, f"image_{missing[0]}", f"is empty, but the question names <image {missing[0]}>")
    if not present:
        raise DataError(source, no, "image_1", "is required (an MMMU row holds image_1 .. image_7)")
    unnamed = [k for k in present if k not in named]
    seen: set[str] = set()

    def place(m: re.Match) -> str:
        first = m.group(1) not in seen
        seen.add(m.group(1))
        return "<image>" if first else f"image {m.group(1)}"

    if named:
        question = "<image>" * len(unnamed) + _MMMU_REF.sub(place, question)
    return [row[f"image_{k}"] for k in [*unnamed, *named]], question


def vstar_rotation(key: str, n: int) -> int:
    """Where V*'s correct option (published first) goes among n: sha256 of `key` mod n, so the gold letter is spread
    evenly over the letters and the same on every run and machine."""
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % n


def _vstar(row: Any, source: str, no: int) -> dict:
    """One V* annotation (`read_vstar` added category, name, annotation, image): the options lettered after rotating
    the published order (correct first) by `vstar_rotation`, gold = the correct option's letter; the targets' boxes
    ([x, y, w, h]) as `boxes` in xyxy pixels, so a zoom can be checked against them."""
    where, options = row["annotation"], row.get("options")
    if not isinstance(row.get("question"), str) or not row["question"].strip():
        raise DataError(where, None, "question", f"must be the question text, got {row.get('question')!r:.120}")
    if not (isinstance(options, list) and len(options) >= 2 and all(isinstance(o, str) and o for o in options)):
        raise DataError(where, None, "options", f"must be a list of at least 2 option texts, got {options!r:.120}")
    k = vstar_rotation(f"{row['category']}/{row['name']}", len(options))
    shown = options[k:] + options[:k]  # the correct option (index 0) lands at index (n - k) % n
    letters = _letters(len(shown))
    lines = "\n".join(f"({letter}) {text}" for letter, text in zip(letters, shown))
    return {
        "id": f"vstar-{row['category']}-{row['name']}",
        "image": row["image"],
        "question": f"{str(row['question']).strip()}\n{lines}",
        "answer": letters[(len(shown) - k) % len(shown)],
        "answer_type": "choice",
        "boxes": [_vstar_box(b, where) for b in row.get("bbox") or []],
        "task": f"vstar/{row['category']}",
        "meta": {
            "benchmark": "vstar",
            "category": row["category"],
            "options": shown,
            "answer": options[0],
            "target_object": list(row.get("target_object") or []),
        },
    }


def _vstar_box(box: Any, where: str) -> list[float]:
    """A V* target box [x, y, w, h] as [x1, y1, x2, y2]."""
    if not (isinstance(box, (list, tuple)) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
        raise DataError(where, None, "bbox", f"each box must be [x, y, w, h] in pixels, got {box!r}")
    x, y, w, h = (float(v) for v in box)
    return [x, y, x + w, y + h]


# ---------------------------------------------------------------- the loaders


def _load(
    name: str,
    convert: Callable[[Any, str, int], dict],
    source: str | Path,
    image_dir,
    check: bool,
    read: tuple[Path | None, Rows],
) -> list[Sample]:
    """Each row converted and checked by the Sample schema; relative image paths resolved and (`check`) looked for."""
    base = Path(image_dir) if image_dir is not None else read[0]
    samples = [sample_from_dict(convert(row, str(source), no), str(source), no, base) for no, row in read[1]]
    if check and base is not None:
        check_image_files(samples, str(source), base, f"pass the folder holding them as image_dir (evals/{name}.yaml)")
    return samples


def load_mathvista(
    source: str | Path,
    image_dir: str | Path | None = None,
    split: str | None = PUBLISHED_SPLIT["mathvista"],
    check_images: bool = True,
) -> list[Sample]:
    """MathVista rows (pid, question, image / decoded_image, choices, unit, precision, answer, question_type,
    answer_type, query, metadata) as Samples `mathvista-<pid>`: the question is the row's `query` (built as
    MathVista's data/query.json when absent), the answer_type choice (gold = the answer's letter), number or text; the
    published fields under meta. Image paths ("images/1.jpg") resolve against image_dir (default: the file's folder)."""
    return _load("mathvista", _mathvista, source, image_dir, check_images, read_rows(source, split))


def load_geometry3k(
    source: str | Path,
    image_dir: str | Path | None = None,
    split: str | None = PUBLISHED_SPLIT["geometry3k"],
    check_images: bool = True,
) -> list[Sample]:
    """EasyR1's Geometry3K rows (images: a list of one image, problem with `<image>`, answer) as math Samples
    `geometry3k-<row>`."""
    return _load("geometry3k", _geometry3k, source, image_dir, check_images, read_rows(source, split))


def load_superclevr(source: str | Path, image_dir: str | Path | None = None, check_images: bool = True) -> list[Sample]:
    """R1-V's SuperCLEVR counting test file (JSONL: image_path, question, ground_truth) as number Samples
    `superclevr-<row>`; image_path ("./images/superCLEVR_new_025000.png") resolves against image_dir (default: the
    file's folder)."""
    return _load("superclevr", _superclevr, source, image_dir, check_images, read_rows(source))


def load_mmmu(
    source: str | Path,
    image_dir: str | Path | None = None,
    split: str | None = PUBLISHED_SPLIT["mmmu"],
    check_images: bool = True,
) -> list[Sample]:
    """MMMU rows (id, question, options, answer, image_1..image_7, question_type, subfield) as Samples with the row's
    id, task `mmmu/<Subject>` (from the id). A row's images go where its text names them (`_mmmu_images`), several
    images included."""
    return _load("mmmu", _mmmu, source, image_dir, check_images, read_rows(source, split))


def load_vstar(
    source: str | Path, image_dir: str | Path | None = None, split: str | None = None, check_images: bool = True
) -> list[Sample]:
    """V* Bench's folders (direct_attributes/, relative_position/: `<name>.jpg` + `<name>.json` with question,
    options (correct first), target_object, bbox) as choice Samples `vstar-<category>-<name>`, task
    `vstar/<category>`; `split` a category reads that one only. `image_dir` is accepted for the loaders' common
    signature and unused: each image lies beside its annotation."""
    return _load("vstar", _vstar, source, None, check_images, read_vstar(source, split))


LOADERS = {
    "mathvista": load_mathvista,
    "geometry3k": load_geometry3k,
    "superclevr": load_superclevr,
    "mmmu": load_mmmu,
    "vstar": load_vstar,
}


def load_benchmark(source: str | Path, name: str | None = None, **options: Any) -> list[Sample]:
    """A benchmark's published file read by its loader (`name`, else the one `benchmark_of` finds), after checking
    it against the sha256 its manifest pins for that file name, when one is pinned."""
    name = name or benchmark_of(source)
    if name not in LOADERS:
        shapes = "; ".join(f"{k}: {', '.join(keys)}" for k, keys in SHAPES.items())
        raise InputError(
            f"{source}: not a file of {', '.join(LOADERS)} in its published shape ({shapes}; vstar: a folder holding "
            "direct_attributes/ and relative_position/)"
        )
    if Path(source).is_file():
        verify_sha256(source, pinned_sha256(name, Path(source).name), name)
    return LOADERS[name](source, **options)
