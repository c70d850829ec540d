"""Box overlap scores and many-to-many matching: IoU, GIoU, thresholded IoU, greedy matching with a penalty.

Pure functions of xyxy boxes that are already in the same pixel space (original-image pixels); parsing and
conversion live in `boxes.py`. Knows nothing of completions, samples or models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Box = Sequence[float]


def _area(b: Box) -> float:
    """Area of an xyxy box; an inverted or empty box has area 0."""
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


def _intersection(a: Box, b: Box) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def iou(a: Box, b: Box) -> float:
    """Intersection over union in [0, 1]; 0 when the union is empty."""
    inter = _intersection(a, b)
    union = _area(a) + _area(b) - inter
    return inter / union if union > 0 else 0.0


def giou(a: Box, b: Box) -> float:
    """Generalised IoU (Rezatofighi et al. 2019) in [-1, 1]: IoU - (C - U) / C with C the smallest enclosing box.
    Unlike IoU it still ranks disjoint boxes by how far apart they are. -1 when the enclosing box is empty."""
    inter = _intersection(a, b)
    union = _area(a) + _area(b) - inter
    enclose = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    if enclose <= 0:
        return -1.0
    return (inter / union if union > 0 else 0.0) - (enclose - union) / enclose


def greedy_match(pred: Sequence[Box], gold: Sequence[Box], pair_score: Callable[[Box, Box], float]):
    """Pair predicted and gold boxes one-to-one, best pair first (ties: lower pred index, then lower gold index).

    Returns [(pred_index, gold_index, score)], min(len(pred), len(gold)) pairs. Greedy, not Hungarian: the usual
    choice for rewards, and identical whenever each gold box has one clearly best prediction.
    """
    pairs = sorted(
        ((pair_score(p, g), i, j) for i, p in enumerate(pred) for j, g in enumerate(gold)),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    used_p: set[int] = set()
    used_g: set[int] = set()
    matched = []
    for score, i, j in pairs:
        if i not in used_p and j not in used_g:
            used_p.add(i)
            used_g.add(j)
            matched.append((i, j, score))
    return matched


def match_reward(
    pred: Sequence[Box], gold: Sequence[Box], pair_score: Callable[[Box, Box], float], unmatched: float = 0.0
) -> float:
    """Mean pair score over max(#pred, #gold) boxes after greedy matching.

    Every unmatched box (an extra prediction or a missed gold box) scores `unmatched`, which is the penalty for
    extra boxes: one perfect box plus one stray box against one gold box earns 0.5 with IoU. No prediction -> the
    `unmatched` value (0 for IoU, -1 for GIoU).
    """
    if not gold:
        raise ValueError("no gold boxes to score against")
    n = max(len(pred), len(gold))
    matched = greedy_match(pred, gold, pair_score)
    return (sum(score for _, _, score in matched) + unmatched * (n - len(matched))) / n


def iou_reward(pred: Sequence[Box], gold: Sequence[Box]) -> float:
    """Continuous IoU in [0, 1] with greedy matching and the extra-box penalty."""
    return match_reward(pred, gold, iou)


def iou_threshold_reward(pred: Sequence[Box], gold: Sequence[Box], threshold: float) -> float:
    """Fraction of max(#pred, #gold) boxes whose IoU-greedy match reaches IoU >= threshold (for one box each: 1 or
    0, i.e. Acc@threshold). Matching on the continuous IoU, not on the 0/1 hits, keeps ties from stealing pairs."""
    if not gold:
        raise ValueError("no gold boxes to score against")
    hits = sum(score >= threshold for _, _, score in greedy_match(pred, gold, iou))
    return hits / max(len(pred), len(gold))


def giou_reward(pred: Sequence[Box], gold: Sequence[Box]) -> float:
    """GIoU in [-1, 1], greedily matched on GIoU; unmatched boxes score -1."""
    return match_reward(pred, gold, giou, unmatched=-1.0)
