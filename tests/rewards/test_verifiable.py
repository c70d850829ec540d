"""Verifiable answers: number signs and tolerance, choice letters and hedges, yes/no first word, text."""

import pytest

from vlgrpo.rewards.verifiable import (
    normalize_text,
    number_match,
    parse_choice,
    parse_number,
    parse_yesno,
    text_match,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3", 3.0),
        ("3.0", 3.0),
        ("three", 3.0),
        ("Three.", 3.0),
        ("There are 3 circles.", 3.0),
        ("3 (three)", 3.0),
        ("The one on the left: 3", 3.0),
        ("-2.5", -2.5),
        ("1,000", 1000.0),
        ("1e3", 1000.0),
        (".5", 0.5),
        ("none", 0.0),
        ("twenty", 20.0),
        ("3 or 4", None),
        ("3-4", None),
        ("two or three", None),
        ("x3", None),
        ("no number", None),
        ("", None),
        (None, None),
        ("1e999", None),
        ("9" * 65, None),
        ("3 " * 2001, None),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("−3", -3.0),
        ("﹣3", -3.0),
        ("－3", -3.0),
        ("The result is −2.5 m", -2.5),
        ("−1,000", -1000.0),
        ("3–5", None),
        ("3−5", None),  # an en dash (or a minus) between two numbers: a range, no single answer
    ],
)
def test_unicode_minus_signs_are_minus(text, expected):
    """U+2212 MINUS SIGN, U+FE63 SMALL HYPHEN-MINUS and U+FF0D FULLWIDTH HYPHEN-MINUS before a number."""
    assert parse_number(text) == expected


def test_number_tolerance_is_max_of_atol_and_rtol_times_gold():
    assert number_match(3.0, 3.0)
    assert not number_match(3.0000001, 3.0)  # both tolerances 0: exact
    assert number_match(3.5, 3.0, atol=0.5) and not number_match(3.51, 3.0, atol=0.5)
    assert number_match(105.0, 100.0, rtol=0.05) and not number_match(105.5, 100.0, rtol=0.05)
    # max(atol, rtol*|b|): atol 1 dominates for small gold, rtol for large gold
    assert number_match(1.9, 1.0, atol=1.0, rtol=0.1) and number_match(109.0, 100.0, atol=1.0, rtol=0.1)
    assert not number_match(None, 3.0, atol=100)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("B", "B"),
        ("(B)", "B"),
        ("B.", "B"),
        ("b", "B"),
        ("[B]", "B"),
        ("**B**", "B"),
        ("Answer: B", "B"),
        ("The answer is (B)", "B"),
        ("B. A red circle", "B"),
        ("B) three", "B"),
        ("Option C: 2 red squares", "C"),
        ("E. None of the above", "E"),
        ("I think the answer is B", "B"),
        ("B, because of a T-shirt", "B"),
        ("A", "A"),
        ("a)", "A"),
        ("A or B or C", None),
        ("A and B", None),
        ("A, B", None),
        ("B/C", None),
        ("(A) (B)", None),
        ("B or A is plausible", None),
        ("Either A or B", None),
        ("B or maybe C", None),
        ("Options: A or B", None),
        ("Choices: C", "C"),
        ("a red circle", None),
        ("the answer is a red circle", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_choice(text, expected):
    assert parse_choice(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("yes", "yes"),
        ("Yes, there is one.", "yes"),
        ("No.", "no"),
        ("**Yes**", "yes"),
        ("  no", "no"),
        ("no, there is no circle", "no"),
        ("not", None),
        ("know", None),
        ("eyes", None),
        ("nope", None),
        ("Nothing", None),
        ("yes or no", None),
        ("No/yes", None),
        ("There is no circle", None),
        ("", None),
    ],
)
def test_parse_yesno(text, expected):
    assert parse_yesno(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("yes and no", None),
        ("Yes and no.", None),
        ("no and yes", None),
        ("Yes & no", None),
        ("yes, or no", None),
        ("Yes and no, it depends", None),
        ("Yes, and no other animals are visible.", "yes"),
        ("Yes and no other animals", "yes"),
        ("No, and not a single cat", "no"),
        ("yes and nothing else", "yes"),
    ],
)
def test_yes_and_no_is_a_hedge_but_a_following_sentence_is_not(text, expected):
    assert parse_yesno(text) == expected


def test_text_normalised_exact_match():
    assert normalize_text("  The  RED, circle! ") == "red circle"
    assert text_match("Red.", "red") and text_match("the red", "Red")
    assert not text_match("red circle", "red") and not text_match("", "red") and not text_match(None, "red")
    assert text_match("ｒｅｄ", "red")  # NFKC folds full-width letters
