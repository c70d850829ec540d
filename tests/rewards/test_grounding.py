"""IoU, GIoU, thresholded IoU and greedy many-to-many matching with the extra-box penalty (hand-computed)."""

import pytest

from vlgrpo.rewards.grounding import giou, giou_reward, greedy_match, iou, iou_reward, iou_threshold_reward


def test_iou_and_giou_by_hand():
    a, b = (0, 0, 10, 10), (5, 0, 15, 10)
    assert iou(a, b) == pytest.approx(50 / 150)  # inter 5x10, union 100+100-50
    assert giou(a, b) == pytest.approx(50 / 150)  # enclosing 15x10 = union: no penalty
    far = (20, 0, 30, 10)
    assert iou(a, far) == 0.0
    assert giou(a, far) == pytest.approx(0 - (300 - 200) / 300)  # enclosing 30x10, union 200
    assert iou(a, a) == 1.0 and giou(a, a) == 1.0
    assert iou(a, (10, 10, 5, 5)) == 0.0  # inverted box has no area
    assert iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0 and giou((0, 0, 0, 0), (0, 0, 0, 0)) == -1.0


def test_greedy_match_takes_best_pair_first():
    gold = [(0, 0, 10, 10), (20, 0, 30, 10)]
    pred = [(20, 0, 30, 10), (0, 0, 10, 5), (50, 50, 60, 60)]
    assert greedy_match(pred, gold, iou) == [(0, 1, 1.0), (1, 0, 0.5)]
    # continuous IoU: (1 + 0.5 + 0 for the extra box) / max(3, 2)
    assert iou_reward(pred, gold) == pytest.approx(1.5 / 3)
    # thresholded at 0.5: two hits out of three
    assert iou_threshold_reward(pred, gold, 0.5) == pytest.approx(2 / 3)
    assert iou_threshold_reward(pred, gold, 0.6) == pytest.approx(1 / 3)
    # GIoU: matched 1 and 0.5 (enclosing box = gold 0 = union), the extra box -1
    assert giou_reward(pred, gold) == pytest.approx((1 + 0.5 - 1) / 3)


def test_extra_and_missing_boxes_are_penalised():
    gold = [(0, 0, 10, 10)]
    assert iou_reward([(0, 0, 10, 10)], gold) == 1.0
    assert iou_reward([(0, 0, 10, 10), (40, 40, 50, 50)], gold) == 0.5  # one stray box halves it
    assert iou_reward([(0, 0, 10, 10)], gold + [(20, 20, 30, 30)]) == 0.5  # one missed gold box
    assert iou_reward([], gold) == 0.0 and giou_reward([], gold) == -1.0
    with pytest.raises(ValueError, match="no gold boxes"):
        iou_reward([(0, 0, 1, 1)], [])


def test_threshold_matching_uses_continuous_iou_not_hits():
    # pred 0 clears 0.5 with both gold boxes (2/3 each), pred 1 equals gold 0 and misses gold 1 (IoU 3/7).
    # Matching on 0/1 hits would pair p0-g0 first (index order) and leave p1-g1 a miss: 0.5. Matching on IoU
    # pairs p1-g0 (1.0) first, then p0-g1 (2/3): both hits.
    gold = [(0, 0, 10, 10), (4, 0, 14, 10)]
    pred = [(2, 0, 12, 10), (0, 0, 10, 10)]
    assert iou(pred[1], gold[1]) == pytest.approx(3 / 7)
    assert iou_threshold_reward(pred, gold, 0.5) == 1.0
    assert iou_reward(pred, gold) == pytest.approx((1.0 + 2 / 3) / 2)
