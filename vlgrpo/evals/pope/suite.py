"""The `pope` eval suite (`SUITE`): probes built from a dataset's objects or read from a POPE question file, scored
per split by the POPE scorer (`pope_score.py`) with the chosen parser; the headline metrics are the means over
splits. Knows nothing of models or engines.
"""

from __future__ import annotations

import math
from pathlib import Path

from vlgrpo.evals.pope.build import build_pope, objects_from_samples
from vlgrpo.evals.pope.files import load_pope
from vlgrpo.evals.pope.score import RATES, Prediction, parse_answer, score_predictions
from vlgrpo.evals.report import groups, table
from vlgrpo.evals.suite import Scores, Selection, Suite, prediction_row
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.extract import answer_region
from vlgrpo.types import Completion, InputError, Sample

POPE_SEED = 0
"""Probes built from a dataset use a fixed seed: every checkpoint of a run is asked the same questions."""
COLUMNS = ("accuracy", "precision", "recall", "f1", "yes_ratio", "unknown")


def pope_from_samples(
    samples: list[Sample],
    splits: tuple[str, ...] = ("random",),
    n_images: int | None = None,
    per_image: int = 3,
    min_objects: int = 3,
    seed: int = POPE_SEED,
) -> list[Sample]:
    """POPE questions built by the POPE builder from the samples' `objects`, as yes/no Samples (id
    `pope-<split>-<question_id>`, task `pope/<split>`, as `load_pope` names them) from n_images of the eligible
    images (None or 0: all of them)."""
    images = objects_from_samples(samples)
    eligible = sum(len(im.objects) >= min_objects for im in images)
    if eligible == 0:
        raise InputError(
            f"POPE: none of the {len(images)} images has >= {min_objects} distinct objects (Sample.objects) to ask "
            f"about: give rows whose `objects` list >= {min_objects} names, or a POPE question file (`vlgrpo eval "
            "--pope-data`, or eval.data for the in-loop eval); `vlgrpo eval --pope-min-objects` lowers the bound"
        )
    n = min(n_images, eligible) if n_images else eligible
    pope = build_pope(images, n, per_image, min_objects, seed, splits=tuple(splits))
    sizes = {str(Path(s.image).resolve()): s.image_size for s in samples}
    return [
        Sample(
            id=f"pope-{split}-{row['question_id']}",
            question=row["text"],
            answer=row["label"],
            answer_type="yesno",
            image=row["image"],
            image_size=sizes.get(row["image"]),
            task=f"pope/{split}",
            meta={k: row[k] for k in ("question_id", "split", "object", "sample_id") if k in row},
        )
        for split, rows in pope.questions.items()
        for row in rows
    ]


def pope_from_file(path: str | Path, splits: tuple[str, ...] | None, max_per_split: int | None) -> list[Sample]:
    """POPE questions of a question file / saved dataset (`load_pope`), the first `max_per_split` of each split
    (the official files alternate yes/no, so an even cap keeps them balanced)."""
    out = [s for s in load_pope(path) if splits is None or s.meta["split"] in splits]
    if not out:
        raise InputError(f"POPE file '{path}' has no questions of split(s) {list(splits or [])}")
    return _cap_per_split(out, max_per_split)


def _cap_per_split(samples: list[Sample], cap: int | None) -> list[Sample]:
    """The first `cap` POPE questions of each split (all when cap is None)."""
    taken: dict[str, int] = {}
    out = []
    for s in samples:
        taken[s.meta["split"]] = taken.get(s.meta["split"], 0) + 1
        if cap is None or taken[s.meta["split"]] <= cap:
            out.append(s)
    return out


def select(sel: Selection) -> list[Sample]:
    """From the POPE question file when there is one; else probes built over every eligible image (as many
    negatives as the data has), then whole images kept up to `max_samples` questions per split."""
    if sel.pope_file is not None:
        return pope_from_file(sel.pope_file, sel.pope.splits, sel.max_samples)
    o = sel.pope
    pope = pope_from_samples(sel.samples, o.splits or ("random",), o.images, o.per_image, o.min_objects)
    per_image = 2 * o.per_image  # questions of one image stay together: whole images are kept
    return _cap_per_split(pope, math.ceil(sel.max_samples / per_image) * per_image if sel.max_samples else None)


def split_of(s: Sample) -> str:
    return str(s.meta.get("split") or (s.task[len("pope/") :] if s.task.startswith("pope/") else "all"))


def score(samples: list[Sample], completions: list[Completion], ctx: RewardContext, parser: str) -> Scores:
    """The POPE scorer per split; the suite's headline metrics are the means over splits (one split: its own)."""
    preds = [
        Prediction(str(s.meta.get("question_id", s.id)), c.text, s.answer, split_of(s))
        for s, c in zip(samples, completions)
    ]
    splits = score_predictions(preds, parser)["splits"]
    per_split = {name: {**{k: m[k] for k in RATES}, "unknown": m["unknown"] / m["n"]} for name, m in splits.items()}
    metrics = {k: sum(m[k] for m in per_split.values()) / len(per_split) for k in (*RATES, "unknown")}
    if len(per_split) > 1:
        metrics.update({f"{name}/{k}": v for name, m in per_split.items() for k, v in m.items()})
    counts = {"": len(samples), **{name: m["n"] for name, m in splits.items()}}
    rows = []
    for s, c, p in zip(samples, completions, preds):
        parsed, region = parse_answer(c.text, parser), answer_region(c.text)
        rows.append(
            {
                **prediction_row("pope", s, c, s.answer),
                "split": p.split,
                "question_id": s.meta.get("question_id"),
                "parsed": parsed,
                "correct": parsed == s.answer,
                "answered": parsed != "unknown" and bool(region and region.strip()),
            }
        )
    return metrics, counts, rows


def report(metrics: dict, counts: dict, info: dict) -> list[str]:
    splits = groups(counts, "pope")
    if len(splits) == 1:
        rows = [[splits[0], counts["pope"], *(metrics[f"eval/pope/{c}"] for c in COLUMNS)]]
    else:
        rows = [[s, counts[f"pope/{s}"], *(metrics[f"eval/pope/{s}/{c}"] for c in COLUMNS)] for s in splits]
        rows.append(["mean", counts["pope"], *(metrics[f"eval/pope/{c}"] for c in COLUMNS)])
    note = "yes_ratio: share of *predictions* that are yes; unknown: share of answers the parser could not read."
    parser = info.get("pope_parser", "pope")
    return [f"## POPE (parser `{parser}`)", "", *table(["split", "n", *COLUMNS], rows), "", note]


SUITE = Suite(
    "pope",
    "rows whose `objects` name >= 3 distinct objects (POPE asks about them), or a POPE question file",
    select,
    score,
    report,
)
