"""Dataset adapters: JSONL, Hugging Face datasets (saved to disk, parquet, in memory) and image folders.

Each adapter yields raw rows with their row number; `load_samples` checks them through the schema and either fails
on the first bad row (naming file, row and field) or skips and reports every bad row. Knows nothing of models.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlgrpo.data.jsonl import json_rows, read_text
from vlgrpo.data.preset_fields import LABEL_FILES, ConversionReport, RowSkipped
from vlgrpo.data.presets import convert_rows, with_preset_hint
from vlgrpo.data.schema import DataError, sample_from_dict
from vlgrpo.registry import DATA_FORMAT
from vlgrpo.types import Sample

FORMATS = DATA_FORMAT.names
RawRows = tuple[str, "Path | None", Iterator[tuple[int, Any]]]
"""(the name messages use, the directory relative image paths resolve against, (row number, raw row) pairs)."""


@dataclass
class LoadResult:
    samples: list[Sample]
    errors: list[DataError] = field(default_factory=list)
    """Rows that were skipped (errors="skip"), each naming its file, row and field; a preset's RowSkipped rows
    (several turns, several videos, no image, ...) are always here, whatever `errors`."""
    conversion: ConversionReport | None = None
    """What the preset inferred and assumed, when one was used."""
    source: str = ""
    """The file the rows came from (an image folder's labels file), as messages name it."""


def is_saved_dataset(path: str | Path | Any) -> bool:
    """A folder written by datasets' `save_to_disk`: a Dataset (its state.json) or a DatasetDict (its
    dataset_dict.json). The one test of it: every reader of saved datasets asks here."""
    if not isinstance(path, (str, Path)):
        return False
    p = Path(path)
    return p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file())


def saved_splits(path: str | Path) -> list[str] | None:
    """The split names of a saved DatasetDict, in its own order (from its dataset_dict.json, nothing loaded); None
    for anything else (a saved Dataset has no splits)."""
    index = Path(path) / "dataset_dict.json"
    if not (is_saved_dataset(path) and index.is_file()):
        return None
    return [str(s) for s in json.loads(index.read_text()).get("splits", [])]


def detect_format(path: str | Path) -> str:
    p = Path(path)
    if p.is_file():
        if p.suffix in (".jsonl", ".json"):
            return "jsonl"
        if p.suffix == ".parquet":
            return "parquet"
    elif p.is_dir():
        if is_saved_dataset(p):
            return "hf"
        if any((p / name).is_file() for name in LABEL_FILES):
            return "folder"
    else:
        raise DataError(str(path), None, None, "does not exist")
    raise DataError(
        str(path),
        None,
        None,
        "cannot tell the format: expected a .jsonl/.parquet file, a directory saved with datasets' save_to_disk, "
        f"or an image folder with {' or '.join(LABEL_FILES)}; set data.format to one of {', '.join(FORMATS[1:])}",
    )


def _load_hf(path: Path | Any, split: str) -> tuple[Any, bool]:
    """(the dataset, whether `split` was picked from a DatasetDict)."""
    import datasets

    if isinstance(path, (datasets.Dataset, datasets.IterableDataset)):
        return path, False
    if isinstance(path, datasets.DatasetDict):
        ds = path
    elif Path(path).suffix == ".parquet":
        return datasets.Dataset.from_parquet(str(path)), False
    else:
        ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(str(path), None, None, f"has no split '{split}'; splits: {', '.join(ds)}")
        return ds[split], True
    return ds, False


def read_jsonl(source: str | Path, split: str = "train") -> RawRows:
    """A JSON Lines file (or one JSON array); relative image paths resolve against its directory."""
    path = Path(source)
    if not path.is_file():
        raise DataError(str(source), None, None, "does not exist")
    return str(source), path.parent, json_rows(path)


def read_hf(source: str | Path | Any, split: str = "train") -> RawRows:
    """A dataset saved with save_to_disk (its `split`, named `path[split]` in messages and generated ids), a parquet
    file, or a Dataset object in memory."""
    in_memory = not isinstance(source, (str, Path))
    dataset, picked = _load_hf(source, split)
    name = "<in-memory dataset>" if in_memory else str(source) + (f"[{split}]" if picked else "")
    return name, None if in_memory else Path(source).parent, ((no, dict(row)) for no, row in enumerate(dataset, 1))


read_parquet = read_hf


def _parse_cell(value: str) -> Any:
    """CSV cells: JSON for lists/objects/numbers-as-lists, else the string."""
    value = value.strip()
    if value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value if value else None


def read_folder(source: str | Path, split: str = "train") -> RawRows:
    """An image folder with labels.jsonl or labels.csv (CSV cells holding JSON lists are parsed)."""
    folder = Path(source)
    for name in LABEL_FILES:
        label_file = folder / name
        if label_file.is_file():
            break
    else:
        raise DataError(str(folder), None, None, f"image folder needs a labels file: {' or '.join(LABEL_FILES)}")
    if label_file.suffix == ".jsonl":
        return str(label_file), folder, json_rows(label_file)

    def rows():
        try:
            text = read_text(label_file)
        except DataError as e:  # a cell can span lines: the file is read whole or not at all
            yield e.row, e
            return
        for no, row in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):  # row 1 is the header
            yield no, {k: _parse_cell(v or "") for k, v in row.items() if k}

    return str(label_file), folder, rows()


def raw_rows(source: str | Path | Any, format: str = "auto", split: str = "train") -> RawRows:
    """The rows of a dataset in any registered format (vlgrpo.registry.DATA_FORMAT), each with its row number."""
    if format not in FORMATS:
        raise DataError(str(source), None, None, f"data.format '{format}' is not accepted; use one of {FORMATS}")
    if not isinstance(source, (str, Path)):
        return read_hf(source, split)
    return DATA_FORMAT.load(detect_format(source) if format == "auto" else format)(source, split)


def schema_sample(row: Any, source: str, no: int | None, base: Path | None) -> Sample:
    """`schema.sample_from_dict`, its error naming the preset that reads the row when the row is in one's shape."""
    try:
        return sample_from_dict(row, source, no, base)
    except DataError as e:
        raise with_preset_hint(e, row) from None


def load_samples(
    source: str | Path | Any,
    format: str = "auto",
    errors: str = "raise",
    split: str = "train",
    max_samples: int | None = None,
    preset: str = "none",
    columns: dict[str, str] | None = None,
    image_root: str | Path | None = None,
) -> LoadResult:
    """Read a dataset into Samples. errors="raise" fails on the first bad row; "skip" reports and skips it.
    `preset` / `columns` read rows in another project's shape (vlgrpo.data.presets); `image_root` is the directory
    relative image paths resolve against (default: the file's directory)."""
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
    name, base, rows = raw_rows(source, format, split)
    base = Path(image_root) if image_root is not None else base
    result = LoadResult(samples=[], source=name)
    if preset != "none" or columns:
        result.conversion = ConversionReport(preset)
        rows = convert_rows(rows, preset, columns or {}, name, base, result.conversion)
    for no, row in rows:
        try:
            if isinstance(row, DataError):
                raise row
            result.samples.append(schema_sample(row, name, no, base))
        except DataError as e:
            if errors == "raise" and not isinstance(e, RowSkipped):
                raise
            result.errors.append(e)
        if max_samples is not None and len(result.samples) >= max_samples:
            break
    if not result.samples and not result.errors:
        raise DataError(name, None, None, "holds no rows")
    return result


def skip_reason(e: DataError) -> str:
    """What a skipped row is counted under: a preset's reason (several_turns, ...) or row_<field> (row_json for a
    line that is not UTF-8 or not JSON), as `vlgrpo data doctor` names its checks."""
    return e.reason if isinstance(e, RowSkipped) else f"row_{e.field or 'json'}"


def skip_summary(skipped: list[tuple[str, int | None]], shown: int = 10) -> str:
    """(reason, row) pairs as 'image_missing 2 (rows 3, 9), row_json 1 (row 5)': reasons in order of their first
    row, at most `shown` row numbers each."""
    rows: dict[str, list[str]] = {}
    for reason, row in sorted(skipped, key=lambda p: p[1] or 0):
        rows.setdefault(reason, []).append(str(row))
    return ", ".join(
        f"{reason} {len(nos)} ({'row' if len(nos) == 1 else 'rows'} {', '.join(nos[:shown])}"
        f"{', ...' if len(nos) > shown else ''})"
        for reason, nos in rows.items()
    )


def no_usable_row(source: str, skipped: list[tuple[str, int | None]], scope: str = "") -> DataError:
    """The error when every row of a training set was skipped: how many, for which reasons, at which rows."""
    which = f"all {len(skipped)} rows were" if len(skipped) > 1 else "its only row was"
    return DataError(
        source,
        None,
        None,
        f"no usable row{scope}: {which} skipped: {skip_summary(skipped)}; "
        "`vlgrpo data doctor` on the file lists every problem",
    )


def write_jsonl(samples: list[Sample], path: str | Path) -> None:
    """Write Samples as JSONL, every image, video and frame path relative to the file's directory (`../images/a.jpg`
    too), as the loader resolves them: the file moves with its images, to another machine or working directory.
    Paths are compared after resolving symlinks, so a `..` never climbs out of a linked directory; absolute only
    across Windows drives."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = path.parent.resolve()

    def relative(p: Any) -> Any:
        if not isinstance(p, str):
            return p
        try:
            return Path(os.path.relpath(Path(p).resolve(), folder)).as_posix()
        except ValueError:  # another drive (Windows): no relative path exists
            return str(Path(p).resolve())

    with path.open("w") as f:
        for s in samples:
            row = s.to_dict()
            row["image"] = relative(row["image"])
            if "images" in row:
                row["images"] = [relative(p) for p in row["images"]]
            video = row.get("video")
            if isinstance(video, dict):
                video.update(
                    {
                        k: relative(v) if k == "path" else [relative(p) for p in v]
                        for k, v in video.items()
                        if k in ("path", "frames")
                    }
                )
            elif video is not None:
                row["video"] = relative(video) if isinstance(video, str) else [relative(p) for p in video]
            f.write(json.dumps(row) + "\n")
