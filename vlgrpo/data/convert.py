"""`vlgrpo data convert`: read a dataset through a preset (or a column mapping), write vlgrpo JSONL, and report what
was inferred, what was assumed and which rows were skipped or left out (malformed, image missing). Image paths are
written relative to the JSONL, so the file moves with its images; images embedded in parquet / HF datasets are written
to files next to it (deduplicated by content). Knows nothing of models.
"""

from __future__ import annotations

import hashlib
import io
from collections import Counter
from pathlib import Path
from typing import Any

from vlgrpo.data.adapters import LoadResult, load_samples, write_jsonl
from vlgrpo.data.preset_fields import ImageUnusable, RowSkipped
from vlgrpo.types import Sample

SHOWN_ROWS = 10
"""Row numbers listed per reason in the text report (the JSON report lists them all)."""


def convert_dataset(
    source: str | Path,
    out: str | Path,
    preset: str = "none",
    columns: dict[str, str] | None = None,
    image_root: str | Path | None = None,
    split: str = "train",
    fmt: str = "auto",
) -> LoadResult:
    """Convert every row it can, skip (and keep in `errors`) the rest, write `out` (JSONL) and return the result.
    A row with a missing image, video or frame file is left out too (an ImageUnusable error), as training could
    not use it."""
    result = load_samples(
        source, fmt, errors="skip", split=split, preset=preset, columns=columns, image_root=image_root
    )
    is_file: dict[str, bool] = {}  # path -> whether it is a file (rows often share an image: one stat each)
    kept = []
    for s in result.samples:
        missing = []
        for kind, path in local_files(s):
            if path not in is_file:
                is_file[path] = Path(path).is_file()
            if not is_file[path]:
                missing.append((kind, path))
        if missing:
            kind, path = missing[0]
            more = f" (and {len(missing) - 1} more missing file(s) of the row)" if len(missing) > 1 else ""
            result.errors.append(ImageUnusable(result.source, s.row, path, f"{kind} '{path}' does not exist{more}"))
        else:
            kept.append(s)
    result.samples = kept
    write_samples(result.samples, out)
    return result


def local_files(s: Sample) -> list[tuple[str, str]]:
    """(what it is, path) of every file a sample refers to: each image, the video file or each of its frames."""
    out = [("image file", im) for im in s.images if isinstance(im, str)]
    if s.video is not None:
        out += [("video file", s.video.path)] if s.video.path is not None else []
        out += [(f"frame {i} of the video", f) for i, f in enumerate(s.video.frames) if isinstance(f, str)]
    return out


def _materialise(image: str | bytes, folder: Path) -> str | bytes:
    """An image held as bytes written to `folder`, named by content hash (a shared image is written once); a path
    stays as it is."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(image, bytes):
        return image
    try:
        ext = "." + (Image.open(io.BytesIO(image)).format or "img").lower().replace("jpeg", "jpg")
    except (UnidentifiedImageError, OSError):
        ext = ".img"  # the doctor reports it as unreadable; the bytes are kept as they are
    path = folder / (hashlib.sha256(image).hexdigest()[:20] + ext)
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image)
    return str(path)


def write_samples(samples: list[Sample], out: str | Path) -> None:
    """Write Samples as JSONL; images and video frames held as bytes (parquet, HF datasets, lmms-lab hub copies)
    become files in `<out stem>_images/`, named by content hash so a shared image is written once (the Sample then
    holds that path)."""
    out = Path(out)
    folder = out.with_name(out.stem + "_images")
    for s in samples:
        s.images = [_materialise(im, folder) for im in s.images]
        s.image = s.images[0] if s.image is not None else None
        if s.video is not None:
            s.video.frames = [_materialise(f, folder) for f in s.video.frames]
    write_jsonl(samples, out)


def conversion_summary(result: LoadResult) -> dict[str, Any]:
    """Counts and row numbers of a conversion: answer types, rows left as text, box conventions, skipped rows by
    reason, malformed rows (file, row, field, problem), rows whose image is missing or unreadable (row, path,
    problem). Malformed rows and missing images are not written: `vlgrpo data convert` exits 1 for them."""
    rep = result.conversion
    missing = [e for e in result.errors if isinstance(e, ImageUnusable)]
    skipped: dict[str, list[int | None]] = {}
    for e in result.errors:
        if isinstance(e, RowSkipped):
            skipped.setdefault(e.reason, []).append(e.row)
    return {
        "preset": rep.preset if rep else "none",
        "rows": rep.rows if rep else len(result.samples) + len(result.errors),
        "samples": len(result.samples),
        "answer_types": dict(Counter(s.answer_type for s in result.samples).most_common()),
        "answer_type_not_inferred_rows": rep.not_inferred if rep else [],
        "box_conventions": dict(rep.boxes) if rep else {},
        "notes": dict(rep.notes) if rep else {},
        "skipped": skipped,
        "invalid": [str(e) for e in result.errors if not isinstance(e, (RowSkipped, ImageUnusable))],
        "missing_images": [
            {"row": e.row, "image": e.image, "problem": e.problem} for e in sorted(missing, key=lambda e: e.row or 0)
        ],
    }


def _rows(rows: list) -> str:
    more = f", … ({len(rows)} in all)" if len(rows) > SHOWN_ROWS else ""
    return ", ".join(str(r) for r in rows[:SHOWN_ROWS]) + more


def format_summary(summary: dict[str, Any], source: str, out: str) -> str:
    """The readable report of `conversion_summary`."""
    s = summary
    skipped, missing = sum(map(len, s["skipped"].values())), s["missing_images"]
    lines = [
        f"{source} (preset {s['preset']}) -> {out}",
        f"  rows {s['rows']}: {s['samples']} samples written, {skipped} skipped, {len(s['invalid'])} invalid, "
        f"{len(missing)} image missing",
        "  answer types: " + (", ".join(f"{k} {v}" for k, v in s["answer_types"].items()) or "-"),
    ]
    if s["answer_type_not_inferred_rows"]:
        lines.append(
            "  answer_type not inferred (kept as text; the answer is no number, option letter, yes/no, math "
            f"or box): rows {_rows(s['answer_type_not_inferred_rows'])}"
        )
    lines += [f"  boxes read as {k}: {v} rows" for k, v in s["box_conventions"].items()]
    lines += [f"  {k}: {v} rows" for k, v in s["notes"].items()]
    lines += [f"  skipped, {reason}: rows {_rows(rows)}" for reason, rows in s["skipped"].items()]
    lines += [f"  invalid: {e}" for e in s["invalid"][:SHOWN_ROWS]]
    if len(s["invalid"]) > SHOWN_ROWS:
        lines.append(f"  … {len(s['invalid']) - SHOWN_ROWS} more invalid rows (--json lists them all)")
    lines += [f"  image missing, row {m['row']}: {m['image']}" for m in missing[:SHOWN_ROWS]]
    if len(missing) > SHOWN_ROWS:
        lines.append(f"  … {len(missing) - SHOWN_ROWS} more rows with a missing image (--json lists them all)")
    if missing:
        lines.append(
            f"  {len(missing)} rows not written (exit status 1): their image file is missing or unreadable; "
            "fix the paths (or --image-root) and convert again"
        )
    return "\n".join(lines)
