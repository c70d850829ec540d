"""One parse per completion: score() shares a `Parsed` between the components of a recipe; user rewards get text."""

import pytest

import vlgrpo.rewards.parsed as parsed_module
from vlgrpo.rewards import RewardContext, score
from vlgrpo.rewards.parsed import Parsed, parsed
from vlgrpo.types import Sample

BOX = Sample("b", "Where?", None, "box", boxes=[[10, 10, 50, 50]], image_size=(112, 112))
MATH = Sample("m", "Half?", "0.5", "math")
BOX_RECIPE = {"accuracy": 1.0, "format": 0.5, "iou": 1.0, "iou_threshold": 1.0, "iou@0.75": 1.0, "giou": 1.0}


def _counting(monkeypatch, name):
    calls = []
    original = getattr(parsed_module, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(parsed_module, name, wrapper)
    return calls


def test_box_rewards_parse_the_boxes_once_per_completion(monkeypatch):
    calls = _counting(monkeypatch, "parse_boxes")
    text = '<think>t</think><answer>[{"bbox_2d": [10, 10, 50, 50]}]</answer>'
    batch = score([text, text], [BOX, BOX], BOX_RECIPE, RewardContext(box_format="qwen2_5"))
    assert batch.total == [pytest.approx(5.5)] * 2 and batch.failures == []
    assert len(calls) == 2  # one per completion, not one per box reward


def test_math_accuracy_and_format_share_one_math_verify_parse(monkeypatch):
    calls = _counting(monkeypatch, "parse_math")
    batch = score(
        [r"<think>t</think><answer>\frac{1}{2}</answer>"], [MATH], {"accuracy": 1.0, "format": 0.5}, RewardContext()
    )
    assert batch.components == {"accuracy": [1.0], "format": [1.0]} and len(calls) == 1


def test_parsed_is_reused_only_under_its_own_context(tmp_path, monkeypatch):
    ctx = RewardContext(box_format="qwen2_5")
    view = Parsed("<answer>[1, 2, 3, 4]</answer>", ctx)
    assert parsed(view, ctx) is view and parsed(view, RewardContext(box_format="qwen2_5")) is view
    other = parsed(view, RewardContext(box_format="plain"))
    assert other is not view and other.text == view.text
    (tmp_path / "text_rewards.py").write_text("def kind(completion):\n    return float(type(completion) is str)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert score(["x"], [MATH], {"text_rewards:kind": 1.0}, ctx).components == {"text_rewards:kind": [1.0]}
