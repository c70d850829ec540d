"""Qwen3-VL's box convention: `model.arch=qwen3_vl` reads boxes on a 0-1000 grid of the image (the `qwen3`
convention), not Qwen2.5-VL's pixels of the resized input. On a non-square image the two readings disagree."""

import pytest

from vlgrpo.config import load_config
from vlgrpo.rewards import RewardContext, box_format_for_arch, context_from_config, predicted_boxes
from vlgrpo.rewards.registry import iou
from vlgrpo.types import Sample

W, H = 1000, 600  # Qwen2.5-VL's smart_resize (factor 28) makes it 1008 x 588
GOLD = [100, 60, 400, 300]  # original pixels: 0-1000 grid [100, 100, 400, 500]; resized px [100.8, 58.8, 403.2, 294]


def _answer(box) -> str:
    values = ", ".join(str(v) for v in box)
    return f'<answer>[{{"bbox_2d": [{values}], "label": "green square"}}]</answer>'


def test_qwen3_vl_reads_its_boxes_on_0_1000_and_a_qwen2_5_pixel_box_scores_differently():
    """The gold box written as Qwen3-VL does scores 1 under a qwen3_vl run's context. The same box as Qwen2.5-VL
    writes it (resized pixels) read as qwen3 is [100.8, 35.28, 403.2, 176.4] in the original: intersection
    299.2 x 116.4 = 34,826.88; areas 72,000 and 302.4 x 141.12 = 42,674.688 -> IoU 0.4362, a miss at 0.5."""
    assert box_format_for_arch("qwen3_vl") == "qwen3"
    ctx = context_from_config(load_config(overrides=["model.arch=qwen3_vl", "data.answer_format=answer"]))
    assert ctx.box_format == "qwen3"
    sample = Sample(id="g", question="Locate the green square.", answer_type="box", boxes=[GOLD], image_size=(W, H))
    qwen3_box, qwen2_5_box = [100, 100, 400, 500], [100.8, 58.8, 403.2, 294]
    assert predicted_boxes(_answer(qwen3_box), sample, ctx) == [pytest.approx((100.0, 60.0, 400.0, 300.0))]
    assert iou(_answer(qwen3_box), sample, ctx) == pytest.approx(1.0)
    assert iou(_answer(qwen2_5_box), sample, ctx) == pytest.approx(34_826.88 / (72_000 + 42_674.688 - 34_826.88))
    assert iou(_answer(qwen2_5_box), sample, RewardContext(box_format="qwen2_5")) == pytest.approx(1.0)
