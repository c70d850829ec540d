"""Reading the reasoning benchmarks' published files (mathvista, geometry3k, superclevr, mmmu) for their loaders
(`loaders.py`): the rows of a JSON, JSONL or parquet file, a folder of parquet files or a saved dataset, as
they are; which benchmark a file is, from its first row's keys (`SHAPES`); the sha256 a manifest pins for it. V* Bench
(vstar) is a folder, not a file: its annotation files are read here too (`read_vstar`). Local files only, never
downloads; knows nothing of Samples, models or scoring rules.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from vlgrpo.data.adapters import is_saved_dataset, saved_splits
from vlgrpo.data.jsonl import json_rows
from vlgrpo.data.schema import DataError
from vlgrpo.evals.benchmarks import EVALS_DIR, load_manifest
from vlgrpo.types import InputError

SHAPES = {
    "mathvista": ("pid", "question", "question_type", "answer_type", "answer"),
    "mmmu": ("id", "question", "options", "answer", "image_1"),
    "superclevr": ("image_path", "ground_truth"),
    "geometry3k": ("images", "problem", "answer"),
}
"""The keys a row of each published file holds; the first row of a file decides which benchmark it is."""
PUBLISHED_SPLIT = {"mathvista": "testmini", "geometry3k": "test", "mmmu": "validation"}
"""The split each benchmark's papers report, read when none is named (from a saved DatasetDict, or the parquet files
of that split in a folder); a published JSON file is one split already. SuperCLEVR's test file and V* have one."""
Rows = list[tuple[int, Any]]
VSTAR_CATEGORIES = ("direct_attributes", "relative_position")
"""V* Bench's published folders, one per question category (the hub's craigwu/vstar_bench; penghao-wu/vstar's
vstar_bench_eval.py reads exactly these two): each image `<name>.jpg` with its annotation `<name>.json` beside it,
{"target_object": [names], "bbox": [[x, y, w, h], ...], "question": text, "options": [texts, the correct one first]}.
The hub copy also holds OCR/, GPT4V-hard/ and test_questions.jsonl, which the official eval does not read."""
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


# ---------------------------------------------------------------- reading published files


def _parquet_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()  # image columns stay {"bytes", "path"}


def _parquet_files(folder: Path, split: str | None) -> list[Path]:
    """The folder's parquet files (recursively: MMMU's hub layout is <Subject>/validation-00000-of-00001.parquet), only
    those of `split` ("validation-...", or under a folder named so) when given."""
    files = sorted(folder.rglob("*.parquet"))
    return [p for p in files if split is None or p.name.startswith(f"{split}-") or p.parent.name == split]


def _saved_dataset(path: Path, split: str | None):
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split in loaded:
            return loaded[split]
        if len(loaded) != 1:
            raise DataError(str(path), None, None, f"has splits {', '.join(loaded)}; no split '{split}'")
        return next(iter(loaded.values()))
    return loaded


def read_rows(source: str | Path, split: str | None = None) -> tuple[Path | None, Rows]:
    """(the folder relative image paths resolve against, (row number, row) pairs) of a published file: JSON (a list,
    or one object of rows keyed by id as MathVista's testmini.json), JSONL, a parquet file, a folder of parquet files
    (only `split`'s when given), or a dataset saved with save_to_disk (`split` of a DatasetDict). Images stay encoded
    ({"bytes", "path"} or a path)."""
    path = Path(source)
    if is_saved_dataset(path):
        return None, list(enumerate(_saved_dataset(path, split).with_format("arrow")[:].to_pylist(), start=1))
    if path.is_dir():
        files = _parquet_files(path, split)
        if not files:
            raise DataError(str(path), None, None, f"holds no {split or ''} parquet file and is not a saved dataset")
        return path, list(enumerate((row for f in files for row in _parquet_rows(f)), start=1))
    if not path.is_file():
        raise DataError(str(path), None, None, "does not exist")
    if path.suffix == ".parquet":
        return path.parent, list(enumerate(_parquet_rows(path), start=1))
    rows = list(json_rows(path, documents=True))
    for _, row in rows:
        if isinstance(row, DataError):
            raise row
    keyed = rows[0][1] if len(rows) == 1 and isinstance(rows[0][1], dict) else None
    if keyed and all(isinstance(v, dict) for v in keyed.values()):  # {"1": {...}, "2": {...}}
        rows = list(enumerate(keyed.values(), start=1))
    return path.parent, rows


def first_row_keys(path: Path) -> set[str]:
    """The keys of the file's first row (a parquet file's or a saved dataset's columns: a DatasetDict's first
    split's), without reading it all."""
    if is_saved_dataset(path):
        splits = saved_splits(path)
        return set(_saved_dataset(path, splits[0] if splits else None).column_names)
    if path.is_dir() or path.suffix == ".parquet":
        import pyarrow.parquet as pq

        files = _parquet_files(path, None) if path.is_dir() else [path]
        return set(pq.read_schema(files[0]).names) if files else set()
    if path.is_file() and path.suffix in (".json", ".jsonl"):
        for _, row in json_rows(path, documents=True):
            if isinstance(row, dict) and row and all(isinstance(v, dict) for v in row.values()):
                row = next(iter(row.values()))  # testmini.json
            return set(row) if isinstance(row, dict) else set()
    return set()


def benchmark_of(source: str | Path | None) -> str | None:
    """The benchmark whose published shape the file has (SHAPES), or "vstar" for a V* Bench folder, or None (not one,
    or not readable as one). A primitive of `evals/source.py`, which decides what an eval input is."""
    if not isinstance(source, (str, Path)):  # None, or a Dataset object handed to the Sample reader
        return None
    if vstar_folders(source):
        return "vstar"
    try:
        keys = first_row_keys(Path(source))
    except (OSError, ValueError):  # not JSON / parquet / a dataset: the Sample reader reports it
        return None
    return next((name for name, shape in SHAPES.items() if set(shape) <= keys), None)


# ---------------------------------------------------------------- V* Bench: a folder of annotated images


def vstar_folders(source: str | Path) -> dict[str, Path]:
    """{category: folder} of a V* Bench copy: `source` holding direct_attributes/ and / or relative_position/ with
    annotation files in them, or one such category folder itself; {} for anything else."""
    path = Path(source)
    if not path.is_dir():
        return {}
    named = {path.name: path} if path.name in VSTAR_CATEGORIES else {c: path / c for c in VSTAR_CATEGORIES}
    return {c: p for c, p in named.items() if p.is_dir() and any(p.glob("*.json"))}


def _vstar_image(annotation: Path) -> Path:
    """The image beside an annotation file: the file of the same name with an image suffix."""
    found = [annotation.with_suffix(s) for s in IMAGE_SUFFIXES if annotation.with_suffix(s).is_file()]
    if not found:
        raise DataError(
            str(annotation), None, "image", f"no image {annotation.stem}{{{','.join(IMAGE_SUFFIXES)}}} beside it"
        )
    return found[0]


def read_vstar(source: str | Path, split: str | None = None) -> tuple[Path, Rows]:
    """(the V* folder, (row number, row) pairs): every annotation JSON of each category folder (VSTAR_CATEGORIES
    order, files by name), each with `category`, `name` (the file stem), `annotation` (its path) and `image` (the image
    beside it) added. `split`: None or "test" (V* has one split) reads every category there; a category name reads
    that one only."""
    folders = vstar_folders(source)
    if not folders:
        layout = " and / or ".join(f"{c}/" for c in VSTAR_CATEGORIES)
        problem = f"is not a V* Bench folder: it needs {layout} holding <name>.jpg images with <name>.json annotations"
        raise DataError(str(source), None, None, problem + " (the hub's craigwu/vstar_bench)")
    if split not in (None, "test"):
        if split not in folders:
            raise DataError(str(source), None, "split", f"'{split}': use test (all) or one of {', '.join(folders)}")
        folders = {split: folders[split]}
    rows: Rows = []
    for category, folder in folders.items():
        for annotation in sorted(folder.glob("*.json")):
            row = next(iter(json_rows(annotation, documents=True)), (0, None))[1]
            if isinstance(row, DataError):
                raise row
            if not isinstance(row, dict):
                raise DataError(str(annotation), None, None, "must hold one JSON object (question, options, ...)")
            extra = {"category": category, "name": annotation.stem, "annotation": str(annotation)}
            rows.append((len(rows) + 1, {**row, **extra, "image": str(_vstar_image(annotation))}))
    return Path(source), rows


def pinned_sha256(name: str, file_name: str) -> str | None:
    """The sha256 that `evals/<name>.yaml` pins for a file of this name (sources.*.files.<file_name>.sha256), if any."""
    path = EVALS_DIR / f"{name}.yaml"
    if not path.is_file():
        return None  # an installed wheel ships no manifests
    for source in (load_manifest(path).get("sources") or {}).values():
        entry = ((source or {}).get("files") or {}).get(file_name) if isinstance(source, dict) else None
        if isinstance(entry, dict) and entry.get("sha256"):
            return str(entry["sha256"]).lower()
    return None


def verify_sha256(path: str | Path, expected: str | None, name: str = "") -> None:
    """InputError when the file's sha256 is not `expected` (None: nothing pinned, nothing checked)."""
    if not expected:
        return
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise InputError(
            f"{path}: sha256 {digest.hexdigest()} is not the {expected} that evals/{name}.yaml pins; the "
            "file is not the pinned release: fetch it again as evals/README.md says"
        )
