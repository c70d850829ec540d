"""Box parsing and conversion per model convention, scored against original-pixel gold boxes by hand."""

import pytest

from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.rewards import RewardContext, box_format_for_arch, parse_boxes, predicted_boxes, to_original_pixels
from vlgrpo.rewards.boxes import MAX_BOXES, from_original_pixels
from vlgrpo.rewards.registry import giou, iou, iou_threshold
from vlgrpo.types import Sample

W, H = 1000, 600  # original image; Qwen's smart_resize (factor 28) makes it 1008 x 588


def _box_sample(boxes, size=(W, H)):
    return Sample(id="g1", question="Locate the green square.", answer_type="box", boxes=boxes, image_size=size)


def test_smart_resize_geometry_of_the_hand_case():
    assert ProcessorGeometry().resized_hw(H, W) == (588, 1008)  # round(600/28)*28, round(1000/28)*28


def test_qwen2_5_resized_pixels_map_back_and_score_by_hand():
    """Gold [100,100,400,300]. The model writes [126,98,504,392] in the 1008x588 resized input, which is
    [125,100,500,400] in the original (x * 1000/1008, y * 600/588). Intersection 275x200 = 55,000; areas 112,500
    and 60,000; union 117,500 -> IoU 22/47. Enclosing box 400x300 = 120,000 -> GIoU 22/47 - 2,500/120,000."""
    sample = _box_sample([[100, 100, 400, 300]])
    ctx = RewardContext(box_format="qwen2_5")
    text = '<think>t</think><answer>[{"bbox_2d": [126, 98, 504, 392], "label": "green square"}]</answer>'
    assert predicted_boxes(text, sample, ctx) == [pytest.approx((125.0, 100.0, 500.0, 400.0))]
    assert iou(text, sample, ctx) == pytest.approx(22 / 47)
    assert giou(text, sample, ctx) == pytest.approx(22 / 47 - 1 / 48)
    assert iou_threshold(text, sample, ctx) == 0.0  # 0.468 < 0.5
    assert iou_threshold(text, sample, ctx, threshold=0.4) == 1.0
    # Read as original pixels (the bug this convention invites) the IoU would be 54,800 / 116,332 instead.
    plain = RewardContext(box_format="plain")
    assert iou(text.replace("bbox_2d", "b"), sample, plain) == pytest.approx(54_800 / 116_332)


def test_qwen2_5_geometry_comes_from_the_context():
    small = ProcessorGeometry(max_pixels=200_000)  # a tighter budget shrinks the resized input
    rh, rw = small.resized_hw(H, W)
    assert (rh, rw) == (336, 560)
    out = to_original_pixels([(56.0, 33.6, 112.0, 67.2)], "qwen2_5", (W, H), small)
    assert out == [pytest.approx((100.0, 60.0, 200.0, 120.0))]


@pytest.mark.parametrize(
    "text",
    [
        "<|object_ref_start|>green square<|object_ref_end|><|box_start|>(200,100),(500,500)<|box_end|>",
        "<answer><|box_start|>(200, 100), (500, 500)<|box_end|></answer>",
        "green square(200,100),(500,500)",  # special tokens stripped by skip_special_tokens=True
        "<|box_start|>(200.0,100.0),(500.0,500.0)<|box_end|>",  # decimals accepted
    ],
)
def test_qwen2_normalised_0_1000(text):
    """(200,100),(500,500) on 0-1000 of a 1000x600 image is [200,60,500,300]; gold [100,60,400,300]:
    intersection 200x240 = 48,000, each area 72,000, union 96,000 -> IoU exactly 0.5 (>= tau 0.5 -> hit)."""
    sample = _box_sample([[100, 60, 400, 300]])
    ctx = RewardContext(box_format="qwen2")
    assert predicted_boxes(text, sample, ctx) == [pytest.approx((200.0, 60.0, 500.0, 300.0))]
    assert iou(text, sample, ctx) == pytest.approx(0.5)
    assert iou_threshold(text, sample, ctx) == 1.0


def test_qwen3_json_normalised_0_1000_and_plain_pixels():
    sample = _box_sample([[100, 60, 400, 300]])
    qwen3 = '```json\n[{"bbox_2d": [200, 100, 500, 500], "label": "green square"}]\n```'
    assert iou(qwen3, sample, RewardContext(box_format="qwen3")) == pytest.approx(0.5)
    assert iou("[200, 60, 500, 300]", sample, RewardContext(box_format="plain")) == pytest.approx(0.5)
    assert iou("[200.5, 60, 500.5, 300]", sample, RewardContext(box_format="plain")) == pytest.approx(
        199.5 * 240 / (72_000 * 2 - 199.5 * 240)
    )


def test_parse_boxes_forms():
    assert parse_boxes('[{"bbox_2d": [1, 2, 3, 4]}, {"bbox_2d":[5.5,6,7,8], "label": "a"}]', "qwen2_5") == [
        (1.0, 2.0, 3.0, 4.0),
        (5.5, 6.0, 7.0, 8.0),
    ]
    assert parse_boxes('{"bbox": [1, 2, 3, 4]}', "qwen3") == [(1.0, 2.0, 3.0, 4.0)]
    assert parse_boxes("[1, 2, 3, 4] and [5, 6, 7, 8]", "qwen2_5") == [(1.0, 2.0, 3.0, 4.0), (5.0, 6.0, 7.0, 8.0)]
    assert parse_boxes('[{"bbox_2d": [1, 2, 3, 4], "label": "tru', "qwen2_5") == [(1.0, 2.0, 3.0, 4.0)]  # truncated
    assert parse_boxes("[1, 2, 3]", "plain") == [] and parse_boxes("(1,2),(3)", "qwen2") == []
    assert len(parse_boxes("[0, 0, 1, 1]" * (MAX_BOXES + 5), "plain")) == MAX_BOXES
    with pytest.raises(ValueError, match="'yolo' is not accepted"):
        parse_boxes("[1, 2, 3, 4]", "yolo")


def test_round_trip_and_arch_helper():
    boxes = [(10.0, 20.0, 300.0, 400.0)]
    for fmt in ("qwen2", "qwen2_5", "qwen3", "plain"):
        back = to_original_pixels(from_original_pixels(boxes, fmt, (W, H)), fmt, (W, H))
        assert back == [pytest.approx(boxes[0])]
    assert box_format_for_arch("qwen2_vl") == "qwen2" and box_format_for_arch("qwen2_5_vl") == "qwen2_5"
    with pytest.raises(ValueError, match="no box convention known for model arch 'llava'"):
        box_format_for_arch("llava")


def test_missing_image_size_names_the_sample():
    sample = _box_sample([[0, 0, 10, 10]], size=None)
    with pytest.raises(ValueError, match="sample 'g1' has no image_size"):
        predicted_boxes("[1, 2, 3, 4]", sample, RewardContext(box_format="qwen2"))
    assert predicted_boxes("[1, 2, 3, 4]", sample, RewardContext(box_format="plain")) == [(1.0, 2.0, 3.0, 4.0)]


def test_ambiguous_answer_blocks_give_no_boxes():
    sample = _box_sample([[0, 0, 10, 10]])
    text = "<answer>[0, 0, 10, 10]</answer><answer>[0, 0, 10, 10]</answer>"
    assert predicted_boxes(text, sample, RewardContext()) == []
    assert iou(text, sample, RewardContext()) == 0.0


def test_default_geometry_is_the_released_processors():
    """1920x1080 (2,073,600 px) is under the released processors' 12,845,056 px, so it is only rounded to
    multiples of 28: round(1080/28) = 39 -> 1092, round(1920/28) = 69 -> 1932. (transformers' class default of
    1,003,520 px would shrink it to 728 x 1316.)"""
    from vlgrpo.data.doctor import HUB_GEOMETRY
    from vlgrpo.data.images import DEFAULT_GEOMETRY, checkpoint_geometry

    assert (DEFAULT_GEOMETRY.min_pixels, DEFAULT_GEOMETRY.max_pixels) == (3136, 12_845_056)
    assert ProcessorGeometry() == DEFAULT_GEOMETRY and HUB_GEOMETRY is DEFAULT_GEOMETRY  # the doctor's too
    assert DEFAULT_GEOMETRY.resized_hw(1080, 1920) == (1092, 1932)
    assert checkpoint_geometry("Qwen/Qwen2.5-VL-7B-Instruct")[0] == DEFAULT_GEOMETRY
    assert checkpoint_geometry("Qwen/Qwen2.5-VL-7B-Instruct", None, 401_408)[0].max_pixels == 401_408


def test_qwen2_5_box_on_full_hd_restating_the_gold_scores_1_by_default():
    """Gold [480, 270, 1440, 810]; in the 1932 x 1092 resized input the model writes it as
    [480 * 1932/1920, 270 * 1092/1080, ...] = [483, 273, 1449, 819]. RewardContext() and a config without a model
    must map it back exactly."""
    from vlgrpo.config import load_config
    from vlgrpo.rewards import context_from_config

    sample = _box_sample([[480, 270, 1440, 810]], size=(1920, 1080))
    text = '<answer>[{"bbox_2d": [483, 273, 1449, 819], "label": "car"}]</answer>'
    for ctx in (
        RewardContext(box_format="qwen2_5"),
        context_from_config(load_config(overrides=["model.arch=qwen2_5_vl"])),
    ):
        assert predicted_boxes(text, sample, ctx) == [pytest.approx((480.0, 270.0, 1440.0, 810.0))]
        assert iou(text, sample, ctx) == pytest.approx(1.0)
