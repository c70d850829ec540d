"""What an eval input is, decided once: a `--data` path (or a run's data.test / data.val, or the in-loop eval's
eval.data) resolved into one `EvalSource` - a POPE question file, a published benchmark (a file, a parquet folder, a
saved dataset or V* Bench's folders) with the split it is read at, or rows of the Sample schema with their preset.
The runner loads it once (`EvalSource.load`) and every suite reads the value instead of looking at the path again.

Knows nothing of models, engines or scoring.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from vlgrpo.data.adapters import load_samples, saved_splits
from vlgrpo.data.jsonl import json_rows
from vlgrpo.evals.reasoning.files import PUBLISHED_SPLIT, benchmark_of, first_row_keys
from vlgrpo.evals.reasoning.loaders import load_benchmark
from vlgrpo.types import Sample

EVAL_SPLITS = ("test", "testmini", "validation", "val", "train")
"""The split an eval reads from a saved DatasetDict of Sample rows when none is named: the first of these it holds."""
CONVERT_SPLITS = ("train", *EVAL_SPLITS)
"""`vlgrpo data convert`'s order: a dataset's training rows first."""
KINDS = ("pope", "benchmark", "rows", "none")


@dataclass(frozen=True)
class EvalSource:
    """One eval input, resolved."""

    path: str | Path | None
    kind: str
    """pope: a POPE question file; benchmark: a published benchmark read by its loader; rows: Sample rows (through
    `preset`); none: no data (POPE comes from --pope-data alone)."""
    benchmark: str | None = None
    """The published benchmark whose shape the data has (mathvista, mmmu, geometry3k, superclevr, vstar), also when
    a data preset reads it as rows (an EasyR1-shaped Geometry3K file: the geometry3k suite reads it itself)."""
    split: str | None = None
    """The split read: the one asked for, else a benchmark's published split, else for a saved DatasetDict the
    first of EVAL_SPLITS it holds; None where the data has no splits to choose from."""
    preset: str = "none"
    columns: dict[str, str] = field(default_factory=dict)

    def load(self) -> list[Sample]:
        """The Samples every suite chooses from: a benchmark's (its loader, its pinned sha256 checked) or the rows';
        none for a POPE file (the pope suite reads it) or no data."""
        if self.kind == "benchmark":
            return load_benchmark(self.path, self.benchmark, **({"split": self.split} if self.split else {}))
        if self.kind == "rows":
            split = self.split or "train"  # a file or a saved Dataset: the readers ignore it
            return load_samples(self.path, preset=self.preset, columns=self.columns, split=split).samples
        return []

    def describe(self) -> str:
        """How report.md and metrics.json name it: the path, and what it was read as."""
        what = self.benchmark if self.kind == "benchmark" else self.kind
        return f"{self.path} ({what}{f', split {self.split}' if self.split else ''})"


def resolve_source(
    data: str | Path | None,
    *,
    split: str | None = None,
    preset: str = "none",
    columns: dict | None = None,
    order: tuple[str, ...] = EVAL_SPLITS,
) -> EvalSource:
    """The one decision of what `data` is (see the module docstring). `preset`: the run's data.preset, which keeps
    reading its own benchmark-shaped rows as Samples (a run trained with preset easyr1 on an EasyR1 Geometry3K file).
    `order`: the splits of a saved DatasetDict of rows to prefer when `split` is None."""
    columns = dict(columns or {})
    if data is None:
        return EvalSource(None, "none")
    if is_pope_file(data):
        return EvalSource(data, "pope")
    name = benchmark_of(data)
    if name is not None and not _preset_reads(preset, data):
        return EvalSource(data, "benchmark", name, split or PUBLISHED_SPLIT.get(name), preset, columns)
    return EvalSource(data, "rows", name, rows_split(data, split, order), preset, columns)


def _preset_reads(preset: str, data: str | Path) -> bool:
    """Whether the data preset reads this benchmark-shaped file's rows (then they are the run's own Samples)."""
    if preset == "none" or not Path(data).exists():
        return False
    from vlgrpo.data.presets import matching_presets

    return preset in matching_presets(first_row_keys(Path(data)))


def rows_split(data: str | Path, split: str | None = None, order: tuple[str, ...] = EVAL_SPLITS) -> str | None:
    """`split`, else for a saved DatasetDict the first split of `order` it holds (its first split when none), else
    None (a file or a saved Dataset has no splits)."""
    if split is not None:
        return split
    names = saved_splits(data)
    if names is None:
        return None
    return next((s for s in order if s in names), names[0] if names else None)


def is_pope_file(path: str | Path) -> bool:
    """A JSON/JSONL file of POPE questions (rows with `text` and `label`, no Sample `question`)."""
    p = Path(path)
    if not (p.is_file() and p.suffix in (".json", ".jsonl")):
        return False
    with contextlib.closing(json_rows(p)) as rows:
        row = next(rows, (0, None))[1]  # the first line's or element's value, or a DataError (then: not POPE)
    return isinstance(row, dict) and "label" in row and "text" in row and "question" not in row
