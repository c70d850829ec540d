"""The format reward: strict think/answer structure, the answer-only variant, and an answer that parses for the
row's answer type (reward.format_requires_answer)."""

import pytest

from vlgrpo.config import load_config
from vlgrpo.rewards import RewardContext, context_from_config, score
from vlgrpo.rewards.format import answer_only_ok, format_ok, think_answer_ok
from vlgrpo.types import Sample


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>count them</think><answer>3</answer>", True),
        ("  <think>a\nb</think>\n<answer> 3 </answer>\n", True),  # whitespace around and between is fine
        ("<think></think><answer>3</answer>", False),  # empty reasoning
        ("<think>r</think><answer>  </answer>", False),  # empty answer
        ("<think>r</think><answer>3</answer> extra", False),  # something after the answer
        ("preamble <think>r</think><answer>3</answer>", False),  # something before the think block
        ("<think>r</think> so <answer>3</answer>", False),  # text between the blocks
        ("<answer>3</answer><think>r</think>", False),  # wrong order
        ("<think>r <think>s</think></think><answer>3</answer>", False),  # nested think
        ("<think>r</think><answer>3</answer><answer>4</answer>", False),  # repeated answer
        ("<think>r <answer>2</answer></think><answer>3</answer>", False),  # answer tags inside the reasoning
        ("<think>r</think><answer>3", False),  # truncated
        ("<answer>3</answer>", False),  # no reasoning block
        ("<think>r</think><answer>3</answer><|im_end|>", True),  # decoded with skip_special_tokens=False
        ("<think>r</think><answer>3</answer><|im_end|><|endoftext|>\n", True),
        ("<think>r</think><answer>3</answer>" + "<|im_end|>" * 3, False),
        ("<think>r</think><answer>3</answer>x<|im_end|>", False),
    ],
)
def test_think_answer(text, expected):
    assert think_answer_ok(text) is expected
    assert format_ok(text, "think_answer") is expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>3</answer>", True),
        ("\n<answer>[1, 2, 3, 4]</answer>  ", True),
        ("<answer></answer>", False),
        ("<think>r</think><answer>3</answer>", False),  # the answer-only variant wants no reasoning block
        ("<answer>3</answer>.", False),
        ("<answer>3</answer><answer>3</answer>", False),
        ("3", False),
    ],
)
def test_answer_only(text, expected):
    assert answer_only_ok(text) is expected
    assert format_ok(text, "answer") is expected


def test_unknown_answer_format_is_named():
    with pytest.raises(ValueError, match="'json' is not accepted; use one of: think_answer, answer"):
        format_ok("<answer>3</answer>", "json")


ROWS = {
    "number": Sample("n", "How many?", "3", "number"),
    "choice": Sample("c", "Which?", "B", "choice"),
    "yesno": Sample("y", "Is there?", "yes", "yesno"),
    "math": Sample("m", "Half?", "0.5", "math"),
    "box": Sample("b", "Where?", None, "box", boxes=[[10, 10, 50, 50]], image_size=(112, 112)),
    "text": Sample("t", "Colour?", "red", "text"),
}
PARSABLE = {
    "number": "−7",
    "choice": "(D)",
    "yesno": "No.",
    "math": r"\frac{3}{4}",
    "box": "[1, 2, 3, 4]",
    "text": "banana",
}  # wrong answers, but answers of the right kind


@pytest.mark.parametrize("kind", list(ROWS))
def test_format_needs_an_answer_of_the_rows_type(kind):
    """`<answer>banana</answer>` farmed the full format reward on every row type; now only text accepts it."""
    ctx = RewardContext(box_format="qwen2_5")
    think = "<think>looked</think><answer>{}</answer>"
    batch = score(
        [think.format("banana"), think.format(PARSABLE[kind]), think.format("3 or 4")],
        [ROWS[kind]] * 3,
        {"format": 1.0},
        ctx,
    )
    hedge_parses = kind in ("text", "math")  # for math_verify "3 or 4" is the set {3, 4}
    assert batch.components["format"] == [1.0 if kind == "text" else 0.0, 1.0, 1.0 if hedge_parses else 0.0]
    assert batch.failures == []


def test_format_requires_answer_is_a_config_switch():
    cfg = load_config()
    assert cfg.reward.format_requires_answer is True and RewardContext().format_requires_answer is True
    off = context_from_config(load_config(overrides=["reward.format_requires_answer=false", "reward.box_format=plain"]))
    assert off.format_requires_answer is False
    banana = "<think>t</think><answer>banana</answer>"
    assert score([banana], [ROWS["number"]], {"format": 1.0}, off).components["format"] == [1.0]


CALL = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 30, 40]}}</tool_call>'


@pytest.mark.parametrize(
    "text, answer_format, expected",
    [
        (f"<think>look closer</think>{CALL}<think>it is red</think><answer>red</answer>", "think_answer", True),
        (f"<think>a</think>{CALL}\n<think>b</think>{CALL}<think>c</think><answer>red</answer>", "think_answer", True),
        (f"{CALL}<think>it is red</think><answer>red</answer>", "think_answer", False),  # the calling turn's think
        (f"<think></think>{CALL}<think>r</think><answer>red</answer>", "think_answer", False),  # empty reasoning
        (f"<think>a</think> so {CALL}<think>r</think><answer>red</answer>", "think_answer", False),  # text between
        (f"<think>a</think><answer>x</answer>{CALL}<think>r</think><answer>red</answer>", "think_answer", False),
        (f"<think>a</think>{CALL}", "think_answer", False),  # the trajectory never answered (the turn cap)
        ("<think>a</think><tool_call> </tool_call><think>r</think><answer>red</answer>", "think_answer", False),
        (f"{CALL}<answer>red</answer>", "answer", True),
        (f"{CALL}{CALL}<answer>red</answer>", "answer", True),
        (f"<think>a</think>{CALL}<answer>red</answer>", "answer", False),  # no think blocks in this format
        (f"{CALL}<think>r</think><answer>red</answer>", "answer", False),
    ],
)
def test_a_multi_turn_trajectory_has_the_format_when_each_turn_has_it(text, answer_format, expected):
    """A trajectory's text is its turns one after another: each calling turn is (think and) one tool call, the last
    turn the answer format; before, the whole text was read as one turn and every trajectory that called failed."""
    assert format_ok(text, answer_format) is expected
