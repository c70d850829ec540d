"""Math answers: LaTeX first for bare expressions, math_verify's documented examples, and the bounds (size guard,
deadline, timers of others left intact, worker threads)."""

import signal
import threading
import time

import pytest

from vlgrpo.rewards.mathanswer import MATH_DEADLINE_S, is_bare_latex, math_match, parse_gold, parse_math


def test_math_verify_gold_first_and_equivalent_forms():
    assert math_match(r"\frac{1}{2}", "0.5")
    assert math_match(r"The result is $\boxed{\frac{2}{4}}$", r"\frac{1}{2}")
    assert not math_match(r"\boxed{3}", "4")
    with pytest.raises(ValueError, match="cannot be parsed by math_verify"):
        math_match("3", "")


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        (r"2\sqrt{3}", r"2\sqrt{2}", False),  # math_verify's default extraction reads both as their leading "2"
        (r"\boxed{2\sqrt{2}}", r"2\sqrt{2}", True),
        (r"2\sqrt{2}", r"2\sqrt{2}", True),
        ("1", "x^2 - 1", False),
        ("x^2-1", "x^2 - 1", True),
        ("1024", "2^{10}", True),
        (r"2^{10}", "1024", True),
        ("−3", "-3", True),  # U+2212 in LaTeX
    ],
)
def test_bare_latex_is_parsed_as_latex_first(pred, gold, expected):
    assert math_match(pred, gold) is expected


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("${1,2,3,4}$", r"${1,3} \cup {2,4}$", True),  # README "Example Usage"
        ("(1,2)", "1 < x < 2", True),  # README FAQ: gold inequality, predicted interval
        ("$1 < x < 2$", "(1,2)", False),  # ... but not the other way round
        ("a+2z = 2z + a = 101", "101", True),  # README FAQ: a solution chain ending in the gold number
        ("101", "a+2z = 2z + a = 101", False),  # ... but not the other way round
        (r"The answer is $\frac{1}{2}$", "0.5", True),  # parse() docstring
        ("The answer is 1/2", "0.5", True),  # parse() docstring: plain text
        ("x = 1", "1", True),  # README "x = 1 -> 1"
        (r"10\%", "0.1", True),  # README "10% -> 0.1"
        ("10 cm", "10", True),  # README "10 cm -> 10"
        (r"\frac13", r"\frac{1}{3}", True),  # README "frac13 -> 1/3" (malformed operators)
    ],
)
def test_math_verify_documented_examples(pred, gold, expected):
    """The examples of math_verify's README and `parse` docstring, through our LaTeX-first reading."""
    assert math_match(pred, gold) is expected


def test_what_counts_as_bare_latex():
    assert is_bare_latex(r"2\sqrt{2}") and is_bare_latex("x^2 - 1") and is_bare_latex(r"5\text{ cm}")
    assert not is_bare_latex("$x$") and not is_bare_latex(r"\boxed{3}") and not is_bare_latex(r"\(x\)")
    assert not is_bare_latex("banana") and not is_bare_latex("about 3 apples")  # prose: default extraction
    assert parse_math("banana") == []  # so a word is no math answer (and earns no format reward)


def test_gold_is_parsed_once():
    parse_gold.cache_clear()
    for _ in range(8):
        assert math_match(r"\frac{1}{2}", r"\frac{2}{4}")
    assert parse_gold.cache_info().misses == 1


@pytest.mark.parametrize(
    "pred",
    [
        r"$9^{9^{9^{9}}}$",
        r"$2^{2^{30}}$",
        r"$\binom{10^{9}}{10^{5}}$",
        r"$(10^{10})!$",
        r"$(x+1)^{10^{9}}$",
        r"$\sum_{i=1}^{10^{9}} i$",
    ],
)
def test_numbers_too_large_to_compare_are_no_answer(pred):
    """sympy would evaluate these for hours (9^(9^(9^9))) in `verify`: the size guard refuses them up front."""
    t0 = time.perf_counter()
    assert not math_match(pred, "3")
    assert time.perf_counter() - t0 < MATH_DEADLINE_S + 0.5


def _stuck(*args, **kwargs):
    time.sleep(30)  # stands in for ANTLR on `x^x^…^x` (seconds) or sympy on a huge expression


def test_a_parse_or_verify_that_runs_too_long_stops_at_the_deadline(monkeypatch):
    import vlgrpo.rewards.mathanswer as mathanswer

    mathanswer._math_verify()  # the import and warm-up run once, before any deadline
    mathanswer._parse_checked.cache_clear()  # a memoised parse would not reach the stuck parser
    monkeypatch.setattr(mathanswer, "_parse", _stuck)
    t0 = time.perf_counter()
    assert parse_math(r"\frac{1}{2}") == []  # timed out: no answer
    assert time.perf_counter() - t0 < MATH_DEADLINE_S + 0.3
    monkeypatch.undo()
    gold, pred = parse_gold("0.5"), parse_math(r"\frac{1}{2}")
    mathanswer._verify_checked.cache_clear()
    monkeypatch.setattr(mathanswer, "_math_verify", lambda: (None, _stuck))
    t0 = time.perf_counter()
    assert mathanswer.verify_parsed(gold, pred) is False
    assert time.perf_counter() - t0 < MATH_DEADLINE_S + 0.3


def test_deadline_restores_the_callers_timer_and_handler(monkeypatch):
    import vlgrpo.rewards.mathanswer as mathanswer

    fired = []

    def handler(*_):
        fired.append(True)

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        assert math_match(r"\frac{1}{2}", "0.5")
        monkeypatch.setattr(mathanswer, "_parse", _stuck)
        mathanswer._parse_checked.cache_clear()
        assert parse_math("3") == []  # this one times out
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < remaining <= 30.0 and fired == []
        assert signal.getsignal(signal.SIGALRM) is handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_math_verify_from_a_worker_thread():
    """Signals only work on the main thread: there the deadline is off and the caps and size guard bound it."""
    results: list = []

    def work():
        try:
            results.append(
                (
                    math_match(r"\boxed{\frac{1}{2}}", "0.5"),
                    math_match(r"\boxed{2}", "3"),
                    math_match(r"$9^{9^{9^{9}}}$", "3"),
                )
            )
        except Exception as e:  # noqa: BLE001 - surfaced by the assertion below
            results.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=60)
    assert results == [(True, False, False)]


TWO_STAGE_CORPUS = [
    r"\frac{1}{2}",
    "0.5",
    "3.14",
    "-3",
    "1,000",
    r"2\sqrt{2}",
    r"\sqrt[3]{2}",
    "2^{10}",
    r"\frac{\pi}{4}",
    r"\frac13",
    "x^3",
    "x^2 - 1",
    "2x^3 + 3x^2 - x + 7",
    r"\pi r^2",
    r"\pi^2",
    "a^2+b^2=c^2",
    "xy^2",
    r"x^3_1",
    r"\alpha^2",
    r"\left(\frac{1}{2}, \frac{\sqrt{3}}{2}\right)",
    "(1,2)",
    "[0, 1)",
    r"\{1, 2, 3\}",
    r"{1,3} \cup {2,4}",
    "1 < x < 2",
    "x = 5",
    "y = 2x + 1",
    "a+2z = 2z + a = 101",
    r"e^{i\pi}",
    "i",
    r"\sin^2 x + \cos^2 x",
    r"\log_2 8",
    r"\frac{a+b}{c-d}",
    r"10\%",
    r"5\text{ cm}",
    r"\begin{pmatrix}1 & 2\\3 & 4\end{pmatrix}",
    r"\dfrac{3}{4}",
    r"x \in [0, \infty)",
    r"\binom{5}{2}",
    "3!",
    r"\infty",
    r"-\frac{\sqrt{2}}{2}",
    r"\ln(x^2)",
]
"""Answer shapes of every kind: numbers, radicals, powers of letters (SLL reports an error there: LL finishes),
intervals, sets, equations, chains, functions, matrices and math_verify's documented examples."""


def test_two_stage_parsing_gives_the_trees_full_ll_gives():
    """ANTLR's SLL-then-LL strategy must not change one converted expression: parse the corpus both ways."""
    import math_verify
    from latex2sympy2_extended import latex2sympy2 as l2s
    from sympy import srepr

    import vlgrpo.rewards.mathanswer as mathanswer

    def parse_all():
        math_verify.parser.parse_latex_cached.cache_clear()
        return [[srepr(e) for e in math_verify.parse(f"${t}$", parsing_timeout=None)] for t in TWO_STAGE_CORPUS]

    mathanswer._math_verify()
    two_stage = l2s._Latex2Sympy.create_parser
    assert two_stage.two_stage
    fast = parse_all()
    l2s._Latex2Sympy.create_parser = two_stage.__wrapped__  # full LL, as shipped
    try:
        full = parse_all()
    finally:
        l2s._Latex2Sympy.create_parser = two_stage
    assert fast == full
    assert sum(bool(f) for f in fast) == len(TWO_STAGE_CORPUS)  # every shape parsed to something


def test_invalid_latex_fails_in_two_stage_mode_as_in_ll():
    from latex2sympy2_extended.latex2sympy2 import latex2sympy

    import vlgrpo.rewards.mathanswer as mathanswer

    mathanswer._math_verify()
    for bad in [r"\frac{1}{", r"x^{", "2 +* 3"]:
        with pytest.raises(Exception, match="expected|understand"):
            latex2sympy(bad)
