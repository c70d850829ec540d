"""Grounding and VQA metrics on hand-made prediction sets, against hand-computed values (no model)."""

from __future__ import annotations

import pytest

from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.evals.grounding import box_iou, grounding_metrics
from vlgrpo.evals.vqa import check_gold, judge, ungated, vqa_metrics
from vlgrpo.rewards import RewardContext
from vlgrpo.rewards.registry import accuracy
from vlgrpo.types import InputError, Sample


def _box(sid: str, gold, size=None, task: str = "") -> Sample:
    boxes = gold if isinstance(gold[0], list) else [gold]
    return Sample(sid, "Locate it.", answer_type="box", boxes=boxes, image_size=size, task=task)


def _grounding(pairs, box_format: str, geometry=None):
    """(metrics, counts, ious) of [(completion, sample)] under one box convention."""
    ctx = RewardContext(box_format=box_format, geometry=geometry)
    scored = [box_iou(text, s, ctx) for text, s in pairs]
    ious = [v for v, _ in scored]
    metrics, counts = grounding_metrics(ious, [b is not None for _, b in scored], [s.task for _, s in pairs])
    return metrics, counts, ious


def test_plain_boxes_iou_exactly_at_threshold_is_a_hit():
    pairs = [
        ("<answer>[0, 0, 100, 50]</answer>", _box("half", [0, 0, 100, 100])),  # IoU 5000/10000 = 0.5 exactly
        ("<answer>[0, 0, 100, 100]</answer>", _box("exact", [0, 0, 100, 100])),  # 1.0
        ("<answer>no idea</answer>", _box("none", [0, 0, 100, 100])),  # unparseable: IoU 0, parse failure
        ("[0, 0, 100.0, 80]", _box("bare", [0, 0, 100, 100])),  # no tags: the whole text is read; 0.8
    ]
    metrics, counts, ious = _grounding(pairs, "plain")
    assert ious == [0.5, 1.0, 0.0, 0.8]
    assert metrics == {"acc50": 0.75, "acc75": 0.5, "miou": pytest.approx(2.3 / 4), "parse_fail": 0.25}
    assert counts == {"": 4}


def test_qwen2_boxes_on_0_1000_are_converted_to_pixels():
    size = (200, 100)  # x scale 0.2, y scale 0.1
    pairs = [
        ("<answer><|box_start|>(500,0),(1000,1000)<|box_end|></answer>", _box("right", [100, 0, 200, 100], size)),
        ("<answer>(0,0),(500,500)</answer>", _box("corner", [0, 0, 100, 100], size)),  # -> (0,0,100,50): 0.5
    ]
    metrics, _, ious = _grounding(pairs, "qwen2")
    assert ious == [1.0, 0.5]
    assert metrics == {"acc50": 1.0, "acc75": 0.5, "miou": 0.75, "parse_fail": 0.0}


def test_qwen2_5_resized_pixel_boxes_are_mapped_back_before_iou():
    # With model.max_pixels = 1,003,520 (28*28*1280), 2800x1400 is resized to 1400x700 (scale 2); 500x300 to
    # 504x308 (x 500/504, y 300/308: per-axis scales).
    pairs = [
        ('<answer>[{"bbox_2d": [0, 0, 700, 700]}]</answer>', _box("big", [0, 0, 1400, 1400], (2800, 1400))),
        ('<answer>{"bbox_2d": [0, 0, 504, 154]}</answer>', _box("small", [0, 0, 500, 300], (500, 300))),
    ]
    metrics, _, ious = _grounding(pairs, "qwen2_5", ProcessorGeometry(max_pixels=1_003_520))
    assert ious == [1.0, 0.5]  # (0,0,1400,1400) and (0,0,500,150) in original pixels
    assert metrics == {"acc50": 1.0, "acc75": 0.5, "miou": 0.75, "parse_fail": 0.0}
    # Read without the conversion the same answers score 700²/1400² = 0.25 and 77000/150616.
    plain, _, raw = _grounding(pairs, "plain")
    assert raw == [0.25, pytest.approx(77000 / 150616)]
    assert (plain["acc50"], plain["acc75"]) == (0.5, 0.0)


def test_first_predicted_box_counts_against_the_best_gold_box():
    ctx = RewardContext(box_format="plain")
    extra = _box("extra", [0, 0, 100, 100])
    assert box_iou("[0, 0, 10, 10] then [0, 0, 100, 100]", extra, ctx) == (0.01, (0.0, 0.0, 10.0, 10.0))
    two_gold = _box("two", [[50, 50, 60, 60], [0, 0, 10, 10]])
    assert box_iou("[0, 0, 10, 10]", two_gold, ctx)[0] == 1.0
    assert box_iou("<answer>[0,0,10,10]</answer><answer>[0,0,10,10]</answer>", two_gold, ctx) == (0.0, None)


def test_grounding_per_task_and_input_errors():
    pairs = [
        ("[0, 0, 100, 100]", _box("a", [0, 0, 100, 100], task="refcoco/testA")),
        ("[0, 0, 100, 50]", _box("b", [0, 0, 100, 100], task="refcoco/testB")),
        ("nothing", _box("c", [0, 0, 100, 100], task="refcoco/testB")),
    ]
    metrics, counts, _ = _grounding(pairs, "plain")
    assert counts == {"": 3, "task_refcoco/testA": 1, "task_refcoco/testB": 2}
    assert metrics["acc50_task_refcoco/testA"] == 1.0 and metrics["acc50_task_refcoco/testB"] == 0.5
    assert metrics["miou_task_refcoco/testB"] == 0.25 and metrics["parse_fail_task_refcoco/testB"] == 0.5
    with pytest.raises(ValueError, match="image_size"):
        box_iou("(0,0),(10,10)", _box("nosize", [0, 0, 1, 1]), RewardContext(box_format="qwen2"))
    with pytest.raises(ValueError, match="one IoU"):
        grounding_metrics([0.5], [True, False])


def _vqa_set() -> list[tuple[str, Sample]]:
    def s(sid, answer, kind, task=""):
        return Sample(sid, "q", answer=answer, answer_type=kind, task=task)

    return [
        ("<think>three of them</think><answer>3</answer>", s("n1", "3", "number", "shapes/count")),
        ("<answer>3 or 4</answer>", s("n2", "3", "number", "shapes/count")),  # hedge: wrong
        ("I count them.\nAnswer: two", s("n3", "2", "number", "shapes/count")),  # fallback answer line, word
        ("<answer>(B) red</answer>", s("c1", "B", "choice", "mc")),
        ("<answer>No.</answer>", s("y1", "no", "yesno", "mc")),
        ("<answer>yes or no</answer>", s("y2", "yes", "yesno", "mc")),  # hedge: wrong
        ("<answer>The Red.</answer>", s("t1", "red", "text")),
        ("<answer>$\\frac{2}{4}$</answer>", s("m1", "\\frac{1}{2}", "math")),
    ]


def test_vqa_accuracy_by_answer_type_and_task():
    pairs = _vqa_set()
    ctx = RewardContext()
    verdicts = [judge(text, sample, ctx) for text, sample in pairs]
    assert [ok for ok, _ in verdicts] == [True, False, True, True, True, False, True, True]
    assert [read for _, read in verdicts[:4]] == ["3", "3 or 4", "two", "(B) red"]
    metrics, counts = vqa_metrics([s for _, s in pairs], [ok for ok, _ in verdicts])
    assert metrics == {
        "accuracy": 0.75,
        "accuracy_number": 2 / 3,
        "accuracy_choice": 1.0,
        "accuracy_yesno": 0.5,
        "accuracy_text": 1.0,
        "accuracy_math": 1.0,
        "accuracy_task_mc": 2 / 3,
        "accuracy_task_shapes/count": 2 / 3,
    }
    assert counts == {
        "": 8,
        "number": 3,
        "choice": 1,
        "yesno": 2,
        "text": 1,
        "math": 1,
        "task_mc": 3,
        "task_shapes/count": 3,
    }


def test_vqa_ignores_the_training_format_gate():
    text, sample = _vqa_set()[2]  # right answer, no <answer> block
    gated = RewardContext(answer_format="answer", gate_accuracy_on_format=True)
    assert accuracy(text, sample, gated) == 0.0  # the reward withholds it ...
    assert judge(text, sample, ungated(gated)) == (True, "two")  # ... the eval counts it


def test_bad_gold_answers_fail_before_decoding():
    ctx = RewardContext()
    with pytest.raises(InputError, match="sample 'bad'.*not a valid number"):
        check_gold([Sample("ok", "q", "3", "number"), Sample("bad", "q", "many", "number")], ctx, "val.jsonl")
    with pytest.raises(InputError, match="val.jsonl: sample 'b' has answer_type 'box'"):
        check_gold([Sample("b", "q", "[1,2,3,4]", "box", boxes=[[1, 2, 3, 4]])], ctx, "val.jsonl")
    check_gold([s for _, s in _vqa_set()], ctx, "val.jsonl")  # every gold of the hand-made set is valid
