"""Dataset adapters: JSONL, Hugging Face datasets (saved to disk, parquet, in memory) and image folders.

Each adapter yields raw rows with their row number; `load_samples` checks them through the schema and either fails
on the first bad row (naming file, row and field) or skips and reports every bad row. Knows nothing of models.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from vlgrpo.data.presets import ConversionReport, RowSkipped, convert_rows
from vlgrpo.data.schema import DataError, sample_from_dict
from vlgrpo.types import Sample

FORMATS = ("auto", "jsonl", "hf", "parquet", "folder")
LABEL_FILES = ("labels.jsonl", "labels.csv")


@dataclass
class LoadResult:
    samples: list[Sample]
    errors: list[DataError] = field(default_factory=list)
    """Rows that were skipped (errors="skip"), each naming its file, row and field; a preset's RowSkipped rows
    (several images, several turns, ...) are always here, whatever `errors`."""
    conversion: ConversionReport | None = None
    """What the preset inferred and assumed, when one was used."""


def detect_format(path: str | Path) -> str:
    p = Path(path)
    if p.is_file():
        if p.suffix in (".jsonl", ".json"):
            return "jsonl"
        if p.suffix == ".parquet":
            return "parquet"
    elif p.is_dir():
        if (p / "state.json").is_file() or (p / "dataset_dict.json").is_file():
            return "hf"
        if any((p / name).is_file() for name in LABEL_FILES):
            return "folder"
    else:
        raise DataError(str(path), None, None, "does not exist")
    raise DataError(
        str(path), None, None,
        "cannot tell the format: expected a .jsonl/.parquet file, a directory saved with datasets' save_to_disk, "
        f"or an image folder with {' or '.join(LABEL_FILES)}; set data.format to one of {', '.join(FORMATS[1:])}",
    )  # fmt: skip


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based line number, parsed row); blank lines are skipped, malformed JSON raises with the line number.
    A file holding one JSON array (LLaVA's and VLM-R1's .json files) yields its elements, numbered from 1."""
    with path.open(encoding="utf-8") as f:
        head = f.read(4096).lstrip()[:1]
    if head == "[":
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # "Extra data": several values, i.e. JSONL whose first row is a list
                yield e.lineno, DataError(str(path), e.lineno, None, f"malformed JSON array ({e.msg} at line "
                                          f"{e.lineno}, column {e.colno})")  # fmt: skip
                return
            rows = None
        if isinstance(rows, list):
            yield from enumerate(rows, start=1)
            return
    with path.open(encoding="utf-8") as f:
        for no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield no, json.loads(line)
            except json.JSONDecodeError as e:
                yield no, DataError(str(path), no, None, f"malformed JSON ({e.msg} at column {e.colno})")


def _hf_rows(dataset, source: str) -> Iterator[tuple[int, Any]]:
    for no, row in enumerate(dataset, start=1):
        yield no, dict(row)


def _load_hf(path: Path | Any, split: str) -> Any:
    import datasets

    if isinstance(path, (datasets.Dataset, datasets.IterableDataset)):
        return path
    if isinstance(path, datasets.DatasetDict):
        ds = path
    elif Path(path).suffix == ".parquet":
        return datasets.Dataset.from_parquet(str(path))
    else:
        ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(str(path), None, None, f"has no split '{split}'; splits: {', '.join(ds)}")
        return ds[split]
    return ds


def _parse_cell(value: str) -> Any:
    """CSV cells: JSON for lists/objects/numbers-as-lists, else the string."""
    value = value.strip()
    if value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value if value else None


def _folder_rows(folder: Path) -> tuple[Path, Iterator[tuple[int, Any]]]:
    for name in LABEL_FILES:
        label_file = folder / name
        if label_file.is_file():
            break
    else:
        raise DataError(str(folder), None, None, f"image folder needs a labels file: {' or '.join(LABEL_FILES)}")
    if label_file.suffix == ".jsonl":
        return label_file, iter_jsonl(label_file)

    def rows():
        with label_file.open(newline="", encoding="utf-8") as f:
            for no, row in enumerate(csv.DictReader(f), start=2):  # row 1 is the header
                yield no, {k: _parse_cell(v or "") for k, v in row.items() if k}

    return label_file, rows()


def load_samples(
    source: str | Path | Any, format: str = "auto", errors: str = "raise", split: str = "train",
    max_samples: int | None = None, preset: str = "none", columns: dict[str, str] | None = None,
    image_root: str | Path | None = None,
) -> LoadResult:  # fmt: skip
    """Read a dataset into Samples. errors="raise" fails on the first bad row; "skip" reports and skips it.
    `preset` / `columns` read rows in another project's shape (vlgrpo.data.presets); `image_root` is the directory
    relative image paths resolve against (default: the file's directory)."""
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
    if format not in FORMATS:
        raise DataError(str(source), None, None, f"data.format '{format}' is not accepted; use one of {FORMATS}")
    in_memory = not isinstance(source, (str, Path))
    fmt = "hf" if in_memory else (detect_format(source) if format == "auto" else format)
    name = "<in-memory dataset>" if in_memory else str(source)
    if fmt == "jsonl":
        path = Path(source)
        if not path.is_file():
            raise DataError(name, None, None, "does not exist")
        base, rows = path.parent, iter_jsonl(path)
    elif fmt in ("hf", "parquet"):
        base, rows = (None if in_memory else Path(source).parent), _hf_rows(_load_hf(source, split), name)
    else:
        label_file, rows = _folder_rows(Path(source))
        base, name = Path(source), str(label_file)
    base = Path(image_root) if image_root is not None else base
    result = LoadResult(samples=[])
    if preset != "none" or columns:
        result.conversion = ConversionReport(preset)
        rows = convert_rows(rows, preset, columns or {}, name, base, result.conversion)
    for no, row in rows:
        try:
            if isinstance(row, DataError):
                raise row
            result.samples.append(sample_from_dict(row, name, no, base))
        except DataError as e:
            if errors == "raise" and not isinstance(e, RowSkipped):
                raise
            result.errors.append(e)
        if max_samples is not None and len(result.samples) >= max_samples:
            break
    if not result.samples and not result.errors:
        raise DataError(name, None, None, "holds no rows")
    return result


def write_jsonl(samples: list[Sample], path: str | Path) -> None:
    """Write Samples as JSONL with image paths relative to the file where possible."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for s in samples:
            row = s.to_dict()
            if isinstance(s.image, str):
                try:
                    row["image"] = str(Path(s.image).resolve().relative_to(path.parent.resolve()))
                except ValueError:
                    row["image"] = str(Path(s.image).resolve())
            f.write(json.dumps(row) + "\n")
