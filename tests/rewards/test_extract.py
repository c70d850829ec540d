"""Answer extraction: the single answer block, \\boxed{}, and the configurable fallbacks."""

import pytest

from vlgrpo.rewards.extract import answer_block, answer_line, answer_region, extract_answer, last_boxed, last_line


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>r</think><answer> 3 </answer>", "3"),
        ("<answer>B</answer> trailing", "B"),
        ("no tags at all", None),
        ("<answer>1</answer><answer>2</answer>", None),  # several blocks: ambiguous
        ("<answer>3", None),  # truncated, never closed
        ("</answer>3<answer>", None),  # reversed
        ("<answer><answer>3</answer>", None),  # nested open tag
        ("<answer></answer>", ""),
    ],
)
def test_answer_block(text, expected):
    assert answer_block(text) == expected


def test_answer_region_uses_block_or_whole_text():
    assert answer_region("<answer>[1, 2, 3, 4]</answer>") == "[1, 2, 3, 4]"
    assert answer_region('[{"bbox_2d": [1, 2, 3, 4]}]') == '[{"bbox_2d": [1, 2, 3, 4]}]'
    assert answer_region("<answer>a</answer><answer>b</answer>") is None


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # last one, nested braces
        (r"\fbox{7}", "7"),
        (r"\boxed{unbalanced", None),
        ("nothing", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_answer_line_and_last_line():
    assert answer_line("reasoning\nAnswer: B\nmore") == "B"
    assert answer_line("Final answer: 3\nthen\n**Answer:** yes") == "yes"
    assert answer_line("no colon answer here") is None
    assert answer_line("İstanbul\nFINAL ANSWER: C") == "C"  # "İ" lowers to two characters: offsets still right
    assert last_line("first\nsecond line  \n\n  ") == "second line"
    assert last_line("   ") is None


def test_extract_answer_order():
    assert extract_answer("<answer>\\boxed{5} because</answer>") == "5"  # a \boxed inside the block wins
    assert extract_answer("<answer>blue</answer>") == "blue"
    assert extract_answer("<answer>1</answer><answer>2</answer>\nAnswer: 2") is None  # no fallback past bad tags
    assert extract_answer("x \\boxed{9}\nAnswer: 4") == "9"
    assert extract_answer("think...\nAnswer: 4\nbye") == "4"
    assert extract_answer("think...\nit is 4") == "it is 4"
    assert extract_answer("think...\nit is 4", fallback=("answer_line",)) is None
    assert extract_answer("think...\nit is 4", fallback=()) is None
    with pytest.raises(ValueError, match="unknown answer fallback 'first_line'"):
        extract_answer("x", fallback=("first_line",))
