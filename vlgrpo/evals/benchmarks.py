"""Loaders for the real benchmarks described in the top-level `evals/` manifests: the manifests themselves, the
readers they share (saved datasets' splits, image checks) and RefCOCO / RefCOCO+ / RefCOCOg (POPE's loader is
`evals/pope/files.py`).

Local files only - official question files + an image folder, REC refs as JSON (+ COCO instances), or a dataset saved
with datasets' `save_to_disk` - turned into checked Samples by the dataset schema. Never downloads; knows nothing of
models or scoring.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vlgrpo.data.adapters import is_saved_dataset
from vlgrpo.data.jsonl import read_json_rows
from vlgrpo.data.schema import DataError, sample_from_dict
from vlgrpo.types import InputError, Sample

EVALS_DIR = Path(__file__).resolve().parents[2] / "evals"
"""The manifests folder of a source checkout (not shipped in a wheel)."""
MANIFEST_KEYS = ("name", "suite", "loader", "splits", "sources", "prepare")
REC_TEMPLATE = 'Locate the object described as "{expression}".'


def load_manifest(name_or_path: str | Path) -> dict:
    """A benchmark manifest (YAML) by path or by name in `evals/` ("pope_coco" -> evals/pope_coco.yaml)."""
    import yaml

    path = Path(name_or_path)
    if not path.is_file():
        path = EVALS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in EVALS_DIR.glob("*.yaml"))
        raise InputError(f"no benchmark manifest {name_or_path!r}; known: {', '.join(known) or 'none'}")
    manifest = yaml.safe_load(path.read_text())
    missing = [k for k in MANIFEST_KEYS if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise InputError(f"{path}: manifest lacks {', '.join(missing)} (needs {', '.join(MANIFEST_KEYS)})")
    return manifest


def _hf_splits(path: Path) -> Iterator[tuple[str, Any]]:
    """(split name, dataset) for a saved Dataset ("all") or each split of a saved DatasetDict; image columns stay
    encoded (bytes), which is both faster and what the Sample schema stores."""
    import datasets

    loaded = datasets.load_from_disk(str(path))
    parts = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("all", loaded)]
    for name, ds in parts:
        if isinstance(ds.features.get("image"), datasets.Image):
            ds = ds.cast_column("image", datasets.Image(decode=False))
        yield name, ds


def check_image_files(samples: list[Sample], source: str, base: Path, hint: str) -> None:
    paths = sorted({s.image for s in samples if isinstance(s.image, str)})
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise DataError(
            source,
            None,
            "image",
            f"{len(missing)} of {len(paths)} images are missing under '{base}', e.g. '{missing[0]}'; {hint}",
        )


def _pick_split(rows: list[tuple[str, int, dict]], split: str | None, source: str) -> list[tuple[str, int, dict]]:
    if split is None:
        return rows
    kept = [r for r in rows if r[0] == split]
    if not kept:
        found = sorted({r[0] for r in rows})
        raise DataError(source, None, "split", f"has no rows of split '{split}'; splits found: {', '.join(found)}")
    return kept


def _expressions(row: dict, source: str, no: int) -> list[str]:
    """Referring expressions of one ref: `sentences` (strings or refer-style {"sent": ...}), `expressions`,
    `expression` or `answer` (lmms-lab's column: a list of expressions)."""
    for key in ("sentences", "expressions", "expression", "answer"):
        value = row.get(key)
        if value is None:
            continue
        items = [value] if isinstance(value, str) else value if isinstance(value, list) else None
        out = [it.get("sent") or it.get("raw") if isinstance(it, dict) else it for it in items or []]
        if not out or not all(isinstance(e, str) and e.strip() for e in out):
            raise DataError(source, no, key, f"must be a string or a list of strings / {{'sent': ...}}, got {value!r}")
        return [e.strip() for e in out]
    raise DataError(source, no, None, "has no referring expression (sentences, expressions, expression or answer)")


def _xywh_to_xyxy(bbox: Any, size: tuple[int, int] | None, source: str, no: int) -> list[float]:
    """COCO [x, y, w, h] -> [x1, y1, x2, y2]; float noise under 1 px past the image border is clipped to it."""
    if not (isinstance(bbox, (list, tuple)) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
        raise DataError(source, no, "bbox", f"must be COCO [x, y, width, height] in pixels, got {bbox!r}")
    x, y, w, h = (float(v) for v in bbox)
    box = [x, y, x + w, y + h]
    if size is not None:
        limits = (size[0], size[1], size[0], size[1])
        box = [min(v, lim) if v > lim and v - lim < 1 else v for v, lim in zip(box, limits)]
        box = [0.0 if -1 < v < 0 else v for v in box]
    return box


class _Instances:
    """COCO instances looked up by id: the boxes, file names and sizes that refer-style refs leave out."""

    def __init__(self, path: str | Path):
        rows = read_json_rows(path)
        doc = rows[0][1] if len(rows) == 1 else None
        if not isinstance(doc, dict) or "images" not in doc or "annotations" not in doc:
            raise DataError(str(path), None, None, "is not a COCO instances file (needs 'images' and 'annotations')")
        self.images = {im["id"]: im for im in doc["images"]}
        self.anns = {a["id"]: a for a in doc["annotations"]}


def _ref_size(row: dict, im: dict | None, source: str, no: int) -> tuple[int, int] | None:
    """(width, height) from the ref (`width`/`height` or `image_size`), else its COCO image entry, else None."""
    for where in (row, im or {}):
        w, h = (where.get("width"), where.get("height")) if "width" in where else (where.get("image_size") or (0, 0))
        if w or h:
            if not (isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0):
                raise DataError(source, no, "width", f"image size must be positive integers, got {w!r} x {h!r}")
            return w, h
    return None


def _ref_sample_rows(row: dict, source: str, no: int, insts: _Instances | None, name: str, template: str) -> list[dict]:
    ann = insts.anns.get(row.get("ann_id")) if insts else None
    image_id = row.get("image_id", ann and ann.get("image_id"))
    im = insts.images.get(image_id) if insts else None
    # refer's own `file_name` carries an annotation suffix (COCO_train2014_..._16.jpg): prefer the instances' name.
    image = (im or {}).get("file_name") or row.get("image") or row.get("file_name")
    size = _ref_size(row, im, source, no)
    if "bbox" not in row and ann is None:
        hint = "pass the matching COCO instances.json as instances" if insts is None else "instances lacks its ann_id"
        raise DataError(source, no, "bbox", f"is missing; refer-style refs take boxes from their ann_id: {hint}")
    box = _xywh_to_xyxy(row.get("bbox", ann and ann.get("bbox")), size, source, no)
    ref = next((row[k] for k in ("ref_id", "ann_id", "question_id", "id") if row.get(k) is not None), no)
    split = str(row.get("split") or "all")
    meta = {"ref_id": ref, "ann_id": row.get("ann_id"), "image_id": image_id, "split": split}
    return [
        {
            "id": f"{name}-{split}-{ref}-{k}",
            "image": image,
            "question": template.replace("{expression}", expr),
            "answer": json.dumps(box),
            "answer_type": "box",
            "boxes": [box],
            "image_size": list(size) if size else None,
            "task": f"{name}/{split}",
            "meta": {**meta, "expression": expr},
        }
        for k, expr in enumerate(_expressions(row, source, no))
    ]


def load_refcoco(
    source: str | Path,
    image_dir: str | Path | None = None,
    split: str | None = None,
    instances: str | Path | None = None,
    name: str = "refcoco",
    template: str = REC_TEMPLATE,
    check_images: bool = True,
) -> list[Sample]:
    """RefCOCO / RefCOCO+ / RefCOCOg as box Samples: one per referring expression (the usual REC protocol), gold
    box in original-image pixels xyxy, `image_size` set, id `{name}-{split}-{ref}-{k}`, task `{name}/{split}`.

    source: (a) JSON/JSONL refs with `image` or `file_name`, COCO `bbox` [x, y, w, h], `sentences` or `expression`,
    `split`, optional `width`/`height` - or refer-style refs (`refs(unc).p` dumped to JSON: ann_id, image_id,
    sentences, split) with `instances` = the matching COCO instances.json for boxes, file names and sizes; image
    names resolve against image_dir (default: the file's folder); (b) a saved HF dataset in lmms-lab/RefCOCO's
    layout (image, answer = list of expressions, bbox [x, y, w, h], question_id; its `question` column is a
    captioning prompt and is ignored), splits from the DatasetDict."""
    if "{expression}" not in template:
        raise InputError(f"REC template must contain '{{expression}}', got {template!r}")
    path = Path(source)
    insts = _Instances(instances) if instances is not None else None
    if is_saved_dataset(path):
        rows = [
            (str(r.get("split") or split_name), no, dict(r, split=str(r.get("split") or split_name)))
            for split_name, ds in _hf_splits(path)
            for no, r in enumerate(ds, start=1)
        ]
        base = None
    elif path.is_file():
        rows = [
            (str(r.get("split") or "all") if isinstance(r, dict) else "all", no, r) for no, r in read_json_rows(path)
        ]
        base = Path(image_dir) if image_dir is not None else path.parent
    else:
        raise DataError(str(path), None, None, "does not exist (expected a JSON/JSONL refs file or a saved HF dataset)")
    samples = []
    for _, no, row in _pick_split(rows, split, str(path)):
        if not isinstance(row, dict):
            raise DataError(str(path), no, None, f"each row must be a JSON object, got {type(row).__name__}")
        for sample in _ref_sample_rows(row, str(path), no, insts, name, template):
            samples.append(sample_from_dict(sample, str(path), no, base))
    if check_images and base is not None:
        check_image_files(
            samples,
            str(path),
            base,
            "pass the COCO train2014 folder as image_dir (refer-style refs "
            "also need instances for the real file names)",
        )
    _fill_sizes(samples)
    return samples


def _fill_sizes(samples: list[Sample]) -> None:
    """Read (width, height) from the image header where the refs did not give it, once per image; check the box."""
    missing = [s for s in samples if s.image_size is None]
    if not missing:
        return
    from vlgrpo.data.images import image_size  # lazy: pulls in transformers for the resize geometry

    sizes: dict = {}
    for s in missing:
        key = s.image if isinstance(s.image, str) else id(s.image)
        if key not in sizes:
            sizes[key] = image_size(s.image)
        s.image_size = sizes[key]
        w, h = s.image_size
        x1, y1, x2, y2 = s.boxes[0]
        if x1 <= -1 or y1 <= -1 or x2 - w >= 1 or y2 - h >= 1:
            raise DataError(f"sample {s.id}", None, "bbox", f"box {s.boxes[0]} lies outside the {w}x{h} image")
        s.boxes = [[max(0.0, x1), max(0.0, y1), min(x2, w), min(y2, h)]]
        s.answer = json.dumps(s.boxes[0])
