"""POPE's published question files (COCO val2014: coco_pope_{random,popular,adversarial}.json) and saved hub copies
read as yes/no Samples (`load_pope`), with the manifests' shared readers. Local files only, never downloads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from vlgrpo.data.adapters import is_saved_dataset
from vlgrpo.data.jsonl import read_json_rows
from vlgrpo.data.schema import DataError, sample_from_dict
from vlgrpo.evals.benchmarks import _hf_splits, _pick_split, check_image_files
from vlgrpo.evals.pope.build import SPLITS
from vlgrpo.types import Sample

_POPE_FILE_SPLIT = re.compile(rf"_pope_({'|'.join(SPLITS)})\b")  # coco_pope_adversarial.json -> adversarial


def _pope_rows(path: Path, image_dir: str | Path | None) -> tuple[list[tuple[str, int, Any]], Path | None]:
    """(split, row number, row in POPE's keys) and the folder image names resolve against (None: images inside)."""
    if is_saved_dataset(path):
        rows = []
        for name, ds in _hf_splits(path):
            for no, r in enumerate(ds, start=1):
                pope_row = {
                    "question_id": r.get("question_id", no),
                    "text": r.get("question"),
                    "label": r.get("answer"),
                    "image": r.get("image"),
                }
                rows.append((str(r.get("category") or name), no, pope_row))
        return rows, None
    if not path.is_file():
        raise DataError(str(path), None, None, "does not exist (expected a POPE question file or a saved HF dataset)")
    m = _POPE_FILE_SPLIT.search(path.name)
    file_split = m.group(1) if m else "all"
    rows = [
        (str(r.get("split") or file_split) if isinstance(r, dict) else file_split, no, r)
        for no, r in read_json_rows(path)
    ]
    return rows, (Path(image_dir) if image_dir is not None else path.parent)


def load_pope(
    source: str | Path, image_dir: str | Path | None = None, split: str | None = None, check_images: bool = True
) -> list[Sample]:
    """POPE questions as yes/no Samples (id `pope-{split}-{question_id}`, task `pope/{split}`).

    source: a question file in POPE's format (the official `coco_pope_{random,popular,adversarial}.json`, or one
    written by `vlgrpo data pope`) whose `image` names resolve against image_dir (default: the file's folder), or a
    saved HF dataset in lmms-lab/POPE's layout (question_id, question, answer, image, category). A row's split is
    its `split`/`category`, else the `_pope_<split>` in the file name, else "all"; `split` keeps only that one."""
    path = Path(source)
    rows, base = _pope_rows(path, image_dir)
    samples = []
    for row_split, no, row in _pick_split(rows, split, str(path)):
        if not isinstance(row, dict):
            raise DataError(str(path), no, None, f"each row must be a JSON object, got {type(row).__name__}")
        label = row.get("label")
        if not isinstance(label, str) or label.strip().lower() not in ("yes", "no"):
            raise DataError(str(path), no, "label", f"must be 'yes' or 'no', got {label!r}")
        if row.get("question_id") is None:
            raise DataError(str(path), no, "question_id", "is required")
        sample = {
            "id": f"pope-{row_split}-{row['question_id']}",
            "image": row.get("image"),
            "question": row.get("text"),
            "answer": label.strip().lower(),
            "answer_type": "yesno",
            "task": f"pope/{row_split}",
            "meta": {
                "question_id": row["question_id"],
                "split": row_split,
                **{k: row[k] for k in ("object", "sample_id") if k in row},
            },
        }
        samples.append(sample_from_dict(sample, str(path), no, base))
    if check_images and base is not None:
        check_image_files(samples, str(path), base, "pass the COCO val2014 folder as image_dir")
    return samples
