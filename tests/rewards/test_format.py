"""The format reward: strict think/answer structure and the answer-only variant."""

import pytest

from vlgrpo.rewards.format import answer_only_ok, format_ok, think_answer_ok


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
