"""POPE probe builder: per-image object lists -> the random / popular / adversarial yes/no question files.

Follows the original POPE code (RUCAIBox/POPE, `main.py` and `utils.py: pope`); the docstrings say where it
deliberately differs. Object lists come from a COCO `instances_*.json`, POPE's own `{"image", "objects"}` JSONL, or
a Sample dataset (the shapes task). Pure Python: knows nothing of models, prompts or scoring.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from vlgrpo.data.jsonl import read_json_rows
from vlgrpo.data.schema import DataError
from vlgrpo.types import InputError, Sample

SPLITS = ("random", "popular", "adversarial")
TEMPLATE = "Is there a {object} in the image?"
SOURCE_FORMATS = ("auto", "coco", "objects", "samples")
"""coco = instances_*.json (images, annotations, categories); objects = POPE's JSONL of {"image", "objects"};
samples = any dataset `load_samples` reads (JSONL, saved HF dataset, image folder), using each Sample's `objects`."""


@dataclass(frozen=True)
class ImageObjects:
    """One image and the distinct names of the objects in it (first-seen order)."""

    image: str
    objects: tuple[str, ...]
    sample_id: str | None = None


@dataclass
class PopeSet:
    questions: dict[str, list[dict]]
    """split -> rows in POPE's format (question_id, image, text, label) plus split, object and sample_id."""
    images: list[ImageObjects]
    """The selected images, in question order (the same images and positives in every split)."""
    read: int
    """Images read from the source."""
    skipped: int
    """Images dropped for having fewer than `min_objects` distinct objects."""
    stats: dict = field(default_factory=dict)
    """Object frequencies over the selected images (what `popular` ranks by)."""


def _unique(names) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for name in names:
        name = str(name).strip()
        if name:
            seen.setdefault(name, None)
    return tuple(seen)


def objects_from_samples(samples: list[Sample]) -> list[ImageObjects]:
    """One entry per distinct image path; the objects of every Sample on that image are merged and the first
    Sample's id is kept. Rows with several images or a video are left out."""
    by_image: dict[str, tuple[list[str], str]] = {}
    for s in samples:
        if s.several_images_or_video:  # POPE asks about one image
            continue
        if not isinstance(s.image, str):
            raise InputError(f"sample '{s.id}': POPE question files refer to images by path, but this image is bytes")
        key = str(Path(s.image).resolve())
        names, _ = by_image.setdefault(key, ([], s.id))
        names.extend(s.objects)
    return [ImageObjects(image, _unique(names), sid) for image, (names, sid) in by_image.items()]


def objects_from_coco(data: dict, source: str) -> list[ImageObjects]:
    """COCO instances (images, annotations with image_id/category_id, categories with names) -> per-image objects.

    Objects keep annotation order (duplicates merged); images without annotations get an empty list (and are
    skipped by the builder)."""
    try:
        names = {c["id"]: c["name"] for c in data["categories"]}
        files = {im["id"]: im["file_name"] for im in data["images"]}
        per_image: dict = {image_id: [] for image_id in files}
        for no, ann in enumerate(data["annotations"]):
            for key, known in (("image_id", per_image), ("category_id", names)):
                if ann[key] not in known:
                    raise DataError(source, None, "annotations", f"annotation #{no} names unknown {key} {ann[key]}")
            per_image[ann["image_id"]].append(names[ann["category_id"]])
    except (KeyError, TypeError) as e:
        raise DataError(
            source,
            None,
            None,
            f"is not COCO instances JSON (missing {e}): need images[].id/file_name, "
            "annotations[].image_id/category_id, categories[].id/name",
        ) from None
    return [ImageObjects(files[i], _unique(objs), str(i)) for i, objs in per_image.items()]


def objects_from_rows(rows: list[tuple[int, dict]], source: str) -> list[ImageObjects]:
    """POPE's annotation format: {"image": "COCO_val2014_...jpg", "objects": ["person", ...]} per row."""
    out = []
    for no, row in rows:
        image, objects = row.get("image"), row.get("objects")
        if not isinstance(image, str) or not image:
            raise DataError(source, no, "image", "needs the image file name as a string")
        if not (isinstance(objects, list) and all(isinstance(o, str) for o in objects)):
            raise DataError(source, no, "objects", f"must be a list of object names, got {objects!r}")
        sid = row.get("image_id", row.get("id"))
        out.append(ImageObjects(image, _unique(objects), None if sid is None else str(sid)))
    return out


def read_object_lists(source: str | Path, format: str = "auto", split: str = "train") -> list[ImageObjects]:
    """Per-image object lists from a COCO instances file, POPE's objects JSONL or a Sample dataset.

    auto: a JSON object with `annotations` is COCO; JSON rows with `objects` and no `question` are POPE's format;
    anything else (JSONL of Samples, a saved HF dataset, an image folder) is read with `load_samples`."""
    if format not in SOURCE_FORMATS:
        raise InputError(f"--format {format!r} is not accepted; use one of {', '.join(SOURCE_FORMATS)}")
    path = Path(source)
    if not path.exists():
        raise DataError(str(path), None, None, "does not exist")
    rows = read_json_rows(path) if path.is_file() and path.suffix in (".json", ".jsonl") and format != "samples" else []
    first = rows[0][1] if rows else None
    if format == "coco" or (format == "auto" and len(rows) == 1 and isinstance(first, dict) and "annotations" in first):
        if len(rows) != 1 or not isinstance(first, dict):
            raise DataError(str(path), None, None, "--format coco needs one JSON object (COCO instances)")
        return objects_from_coco(first, str(path))
    pope_rows = isinstance(first, dict) and "objects" in first and "question" not in first
    if format == "objects" or (format == "auto" and pope_rows):
        bad = next(((no, r) for no, r in rows if not isinstance(r, dict)), None)
        if bad or not rows:
            raise DataError(str(path), bad and bad[0], None, 'needs JSON rows of {"image": ..., "objects": [...]}')
        return objects_from_rows(rows, str(path))
    from vlgrpo.data.adapters import load_samples

    return objects_from_samples(load_samples(path, split=split).samples)


def question_text(template: str, obj: str) -> str:
    """The template with the object filled in; "a {object}" becomes "an {object}" before a vowel, as in the
    official COCO files ("Is there an umbrella in the image?")."""
    if obj[:1].lower() in "aeiou":
        template = re.sub(r"\ba \{object\}", "an {object}", template)
    return template.replace("{object}", obj)


def _ranked(counts: Counter) -> list[str]:
    """Most frequent first; ties keep first-seen order (Python's stable sort, as the original's `sorted`)."""
    return [name for name, _ in sorted(counts.items(), key=lambda kv: kv[1], reverse=True)]


def co_occurrence(images: list[ImageObjects]) -> dict[str, Counter]:
    """obj -> Counter of the other objects seen in the same image (counted once per image)."""
    co: dict[str, Counter] = {}
    for im in images:
        for o in im.objects:
            co.setdefault(o, Counter()).update(x for x in im.objects if x != o)
    return co


def _negatives(
    split: str,
    image: ImageObjects,
    positives: list[str],
    vocab: list[str],
    popular: list[str],
    co_ranked: dict[str, list[str]],
    rng: random.Random,
) -> list[str]:
    """One negative per positive, never an object of the image nor one already asked about.

    random: uniform over the remaining vocabulary. popular: the most frequent remaining object. adversarial: the
    remaining object that co-occurs most often with *this* positive (`sorted_co_occur[pos_object]` in the original).
    popular/adversarial fall back to random when their ranking runs out, as the original does."""
    used = set(image.objects)
    out = []
    for pos in positives:
        ranking = {"random": [], "popular": popular, "adversarial": co_ranked.get(pos, [])}[split]
        pick = next((o for o in ranking if o not in used), None)
        if pick is None:
            pick = rng.choice([o for o in vocab if o not in used])
        used.add(pick)
        out.append(pick)
    return out


def build_pope(
    images: list[ImageObjects],
    n_images: int | None = 500,
    per_image: int = 3,
    min_objects: int = 3,
    seed: int = 0,
    template: str = TEMPLATE,
    splits: tuple[str, ...] = SPLITS,
) -> PopeSet:
    """The POPE splits: n_images images x (per_image "yes" + per_image "no") questions, interleaved yes/no.

    1. keep images with >= min_objects distinct objects (the paper keeps images with >= 3 ground-truth objects);
    2. sample n_images of them (None = all, shuffled);
    3. per image, sample per_image positives (seeded; the original takes the first 3 listed) - the same in every split;
    4. per split, one negative per positive (see `_negatives`); frequencies and co-occurrences are counted over the
       selected images, as the original does.
    """
    if per_image < 1 or min_objects < per_image:
        raise InputError(f"need 1 <= --per-image ({per_image}) <= --min-objects ({min_objects})")
    if "{object}" not in template:
        raise InputError(f"--template must contain '{{object}}', got {template!r}")
    bad = [s for s in splits if s not in SPLITS]
    if bad or not splits:
        raise InputError(f"unknown POPE splits {bad}; accepted: {', '.join(SPLITS)}")
    eligible = [im for im in images if len(im.objects) >= min_objects]
    n = len(eligible) if n_images is None else n_images
    if n < 1 or n > len(eligible):
        raise InputError(
            f"--n-images {n_images}: {len(eligible)} of {len(images)} images have >= {min_objects} distinct objects; "
            "ask for at most that many (0 takes them all), or lower --min-objects"
        )
    rng = random.Random(seed)
    chosen = rng.sample(eligible, n)
    positives = [rng.sample(list(im.objects), per_image) for im in chosen]
    freq = Counter(o for im in chosen for o in im.objects)
    vocab = list(freq)
    for im in chosen:
        if len(vocab) - len(im.objects) < per_image:
            raise InputError(
                f"image '{im.image}': only {len(vocab) - len(im.objects)} objects of the selected images are absent "
                f"from it, fewer than the {per_image} negatives it needs; select more images (--n-images)"
            )
    popular = _ranked(freq)
    co_ranked = {o: _ranked(c) for o, c in co_occurrence(chosen).items()}
    questions = {}
    for split_no, split in enumerate(splits):
        split_rng = random.Random(seed * 1000 + split_no + 1)  # each split has its own stream
        rows: list[dict] = []
        for im, pos in zip(chosen, positives):
            neg = _negatives(split, im, pos, vocab, popular, co_ranked, split_rng)
            for yes_obj, no_obj in zip(pos, neg):  # yes, no, yes, no, ... as in the official files
                for obj, label in ((yes_obj, "yes"), (no_obj, "no")):
                    row = {
                        "question_id": len(rows) + 1,
                        "image": im.image,
                        "text": question_text(template, obj),
                        "label": label,
                        "split": split,
                        "object": obj,
                    }
                    if im.sample_id is not None:
                        row["sample_id"] = im.sample_id
                    rows.append(row)
        questions[split] = rows
    return PopeSet(questions, chosen, read=len(images), skipped=len(images) - len(eligible), stats=dict(freq))


def write_pope(pope: PopeSet, out_dir: str | Path, name: str = "pope") -> dict[str, Path]:
    """Write `{name}_pope_{split}.jsonl` per split (POPE's JSON lines; absolute image paths become relative to
    out_dir, so the folder can move) and `{name}_pope_build.json` (counts and object frequencies)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in pope.questions.items():
        path = out / f"{name}_pope_{split}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                if os.path.isabs(row["image"]):
                    row = {**row, "image": os.path.relpath(row["image"], out.resolve())}
                f.write(json.dumps(row) + "\n")
        paths[split] = path
    summary = {
        "images_read": pope.read,
        "images_skipped": pope.skipped,
        "images": len(pope.images),
        "questions_per_split": {s: len(r) for s, r in pope.questions.items()},
        "object_frequency": pope.stats,
    }
    (out / f"{name}_pope_build.json").write_text(json.dumps(summary, indent=2) + "\n")
    return paths
