"""REC grounding metrics: Acc@0.5, Acc@0.75, mean IoU and the parse-failure rate, in original-image pixels.

Predicted boxes are read and converted by the rewards module's model-aware parsing (`predicted_boxes`: the box
convention and resize geometry come from the RewardContext); IoU is the rewards module's. The `grounding` eval
suite (`SUITE`). Knows nothing of models or engines.
"""

from __future__ import annotations

from vlgrpo.data.images import image_size
from vlgrpo.evals.report import groups, label, table
from vlgrpo.evals.suite import Scores, Selection, Suite, prediction_row
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.grounding import iou
from vlgrpo.rewards.registry import Box, gold_boxes, predicted_boxes
from vlgrpo.types import Completion, Sample

THRESHOLDS = (0.5, 0.75)
"""Acc@tau thresholds reported as acc50 and acc75 (a hit is IoU >= tau, so IoU exactly 0.5 counts at 0.5)."""


def box_iou(completion: str, sample: Sample, ctx: RewardContext) -> tuple[float, Box | None]:
    """(IoU, first predicted box in original pixels) of one completion; (0.0, None) when no box can be read.

    REC protocol: the model's *first* box is its answer (extra boxes are ignored, not penalised as in the reward);
    its IoU is the best over the gold boxes (REC has exactly one). Several or malformed answer blocks read as no box.
    """
    boxes = predicted_boxes(completion, sample, ctx)
    if not boxes:
        return 0.0, None
    first = boxes[0]
    return max(iou(first, g) for g in gold_boxes(sample)), first


def acc_key(tau: float) -> str:
    """acc50 for 0.5, acc75 for 0.75."""
    return f"acc{round(tau * 100)}"


def _summary(ious: list[float], parsed: list[bool], thresholds: tuple[float, ...]) -> dict[str, float]:
    n = len(ious)
    out = {acc_key(t): sum(v >= t for v in ious) / n for t in thresholds}
    out["miou"] = sum(ious) / n
    out["parse_fail"] = sum(not p for p in parsed) / n
    return out


def grounding_metrics(
    ious: list[float], parsed: list[bool], tasks: list[str] | None = None, thresholds: tuple[float, ...] = THRESHOLDS
) -> tuple[dict[str, float], dict[str, int]]:
    """(metrics, counts) over the samples of the suite.

    metrics: acc50, acc75 (share with IoU >= tau), miou (mean IoU, unparseable = 0), parse_fail (share without a
    readable box); with `tasks`, the same four per task as `<metric>_task_<task>`. counts: "" -> n, "task_<task>"
    -> n per task (the keys the report pairs with the metrics)."""
    if not ious or len(ious) != len(parsed) or (tasks is not None and len(tasks) != len(ious)):
        raise ValueError(f"need one IoU, parse flag (and task) per sample; got {len(ious)}, {len(parsed)}")
    metrics, counts = _summary(ious, parsed, thresholds), {"": len(ious)}
    for task in sorted({t for t in tasks or [] if t}):
        rows = [i for i, t in enumerate(tasks) if t == task]
        part = _summary([ious[i] for i in rows], [parsed[i] for i in rows], thresholds)
        metrics.update({f"{k}_task_{task}": v for k, v in part.items()})
        counts[f"task_{task}"] = len(rows)
    return metrics, counts


COLUMNS = {"acc50": "Acc@0.5", "acc75": "Acc@0.75", "miou": "mIoU", "parse_fail": "parse fail"}


def select(sel: Selection) -> list[Sample]:
    """The box samples whose boxes lie in one image, the first `max_samples`; a missing `image_size` is read from
    that image's header."""
    samples = [s for s in sel.samples if s.answer_type == "box" and len(set(s.box_images)) <= 1][: sel.max_samples]
    for s in samples:
        if s.image_size is None:
            s.image_size = image_size(s.images[s.box_images[0] if s.box_images else 0])
    return samples


def score(samples: list[Sample], completions: list[Completion], ctx: RewardContext, parser: str) -> Scores:
    scored = [box_iou(c.text, s, ctx) for s, c in zip(samples, completions)]
    ious, parsed = [v for v, _ in scored], [b is not None for _, b in scored]
    metrics, counts = grounding_metrics(ious, parsed, [s.task for s in samples])
    rows = [
        {
            **prediction_row("grounding", s, c, s.boxes),
            "pred_box": list(b) if b else None,
            "iou": v,
            "answered": b is not None,
        }
        for s, c, (v, b) in zip(samples, completions, scored)
    ]
    return metrics, counts, rows


def report(metrics: dict, counts: dict, info: dict) -> list[str]:
    cols = list(COLUMNS)
    rows = [["all", counts["grounding"], *(metrics[f"eval/grounding/{c}"] for c in cols)]]
    rows += [
        [label(g), counts[f"grounding/{g}"], *(metrics[f"eval/grounding/{c}_{g}"] for c in cols)]
        for g in groups(counts, "grounding")
    ]
    head = ["group", "n", *COLUMNS.values()]
    return ["## Grounding (REC, IoU of the first box in original-image pixels)", "", *table(head, rows)]


SUITE = Suite("grounding", "samples of answer_type box", select, score, report)
