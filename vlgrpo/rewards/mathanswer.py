"""Math answers through math_verify: which text is parsed, LaTeX first for bare expressions, the bounds, the speed.

math_verify's default extraction reads bare LaTeX by its leading number (`2\\sqrt{2}` -> 2), so an answer or gold
without delimiters is parsed as `$…$` first. Bounds on one check: a length cap on what reaches the parser, a size
guard before `verify` (a 14-character power tower would take hours in sympy), and a sub-second deadline on the main
thread. Speed: latex2sympy's ANTLR parser runs in ANTLR's two-stage mode (SLL prediction, full LL only after an SLL
syntax error: the same trees, 5-30x faster on most answers), its shared DFA is warmed on common answer shapes once,
and parsed answers are memoised (a group's G completions often give the same answer). Knows nothing of completions'
tags, samples, models or configs.
"""

from __future__ import annotations

import functools
import math
import re
import signal
import threading
import time

MAX_LATEX_CHARS = 100
"""A bare answer longer than this is not parsed as LaTeX (math_verify's LaTeX parser is ANTLR's Python runtime,
about 1 ms per token on ambiguous input); it goes to the default extraction instead."""
MAX_MATH_CHARS = 120
"""Only the last this-many characters of a longer text reach math_verify's default extraction (a free-form
completion's closing "so the answer is $\frac{3}{4}$." fits)."""
MATH_DEADLINE_S = 0.5
"""Wall-clock bound of one math check (parse + verify) on the main thread. Short real answers parse in 1-90 ms on
a 2-core machine; the deadline only cuts pathological input (e.g. `x^x^x^…`, seconds in ANTLR). math_verify's own
timeouts count whole seconds, so they are switched off in favour of this one. Off the main thread no signal can be
used: the caps and the size guard are the bound there."""
MAX_RESULT_DIGITS = 1000
"""The size guard: a prediction whose numbers would have more digits than this (10^{10^{9}}, (10^9)!) is no answer."""
MAX_NODES = 400

_DELIMITERS = ("$", "\\(", "\\[", "\\boxed", "\\fbox")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")


class _Deadline(BaseException):
    """Raised by the SIGALRM handler; a BaseException so that math_verify's `except Exception` cannot swallow it."""


def _raise_deadline(signum, frame):
    raise _Deadline


def _within_deadline(fn, *args, default=None):
    """fn(*args), or `default` when it runs past MATH_DEADLINE_S (main thread only; elsewhere it simply runs).
    A timer someone else had armed is re-armed afterwards with what was left of it."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return fn(*args)
    previous = signal.signal(signal.SIGALRM, _raise_deadline)
    start = time.monotonic()
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, MATH_DEADLINE_S)
    try:
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Deadline:
        return default
    finally:
        signal.signal(signal.SIGALRM, previous)
        if old_delay:
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - start), 1e-3), old_interval)


def is_bare_latex(text: str) -> bool:
    """An expression without math delimiters and without prose words ("2\\sqrt{2}", "x^2 - 1", "10 cm"): a word of
    three or more letters that is not a LaTeX command ("about", "banana") marks prose."""
    return not any(d in text for d in _DELIMITERS) and not _PROSE_WORD.search(text)


WARM_UP = (
    r"\frac{1}{2}",
    r"2\sqrt{3}",
    r"x^2 - 1",
    r"2x^3 + 3x^2 - x + 7",
    r"\left(\frac{1}{2}, 3\right)",
    r"[0, 1)",
    r"\{1, 2\}",
    r"y = 2x + 1",
    r"\pi r^2",
    r"e^{i\pi}",
    r"\sin^2 x",
    r"10\%",
    r"\dfrac{a+b}{c}",
    r"3.5",
)
"""Answer shapes parsed once at start-up: ANTLR builds its prediction DFA lazily and shares it between parses, so
the first parse of a new shape costs 10-300 ms and later ones a few ms."""


def use_two_stage_parsing() -> None:
    """Make latex2sympy's ANTLR parser predict in SLL mode first and fall back to full LL only when SLL reports a
    syntax error: ANTLR's documented two-stage strategy. Its PredictionMode.SLL contract: an SLL parse either
    returns the same tree LL returns or reports a syntax error, so the converted expressions are unchanged
    (tests/rewards/test_mathanswer.py compares them on a corpus). latex2sympy raises on every reported syntax error,
    so a failed SLL attempt cannot leave a repaired tree behind. Idempotent; patches the one parser factory."""
    from antlr4.atn.PredictionMode import PredictionMode
    from latex2sympy2_extended import latex2sympy2 as l2s

    if getattr(l2s._Latex2Sympy.create_parser, "two_stage", False):
        return
    ll_parser = l2s._Latex2Sympy.create_parser

    def create_parser(self, latex_str):
        parser = ll_parser(self, latex_str)
        parser._interp.predictionMode = PredictionMode.SLL
        sll_math = parser.math

        def math():
            try:
                return sll_math()
            except Exception:  # needs full context, or is invalid (then LL raises the same error again)
                return ll_parser(self, latex_str).math()

        parser.math = math
        return parser

    create_parser.two_stage, create_parser.__wrapped__ = True, ll_parser
    l2s._Latex2Sympy.create_parser = create_parser


@functools.cache
def _math_verify():
    """math_verify's (parse, verify), imported and warmed up once, outside any deadline (the import and the
    warm-up take about 1 s). Its one-time "timeout is disabled" warnings are silenced: the deadline above is the
    timeout."""
    import math_verify.grader
    import math_verify.parser

    use_two_stage_parsing()
    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    gold = math_verify.parse("$x^2 - 1$", parsing_timeout=None)
    for text in WARM_UP:  # verify's first `simplify` imports sympy.physics (0.4 s): paid here, not by an answer
        math_verify.verify(gold, math_verify.parse(f"${text}$", parsing_timeout=None), timeout_seconds=None)
    return math_verify.parse, math_verify.verify


def _parse(text: str, answer: bool) -> list:
    parse, _ = _math_verify()
    # no_fallback: a match that does not convert to an expression is no answer (math_verify would return its
    # string); first_match: only the last, highest-priority match is converted, not every one in turn.
    options = {"parsing_timeout": None, "fallback_mode": "no_fallback", "extraction_mode": "first_match"}
    if answer and len(text) <= MAX_LATEX_CHARS and is_bare_latex(text):
        parsed = parse(f"${text}$", **options)
        if parsed:
            return parsed
    return parse(text[-MAX_MATH_CHARS:], **options)


def parse_math(text: str | None, answer: bool = True) -> list:
    """math_verify's parse of `text` ([expression, its string] or [] for none). `answer`: the text is a final
    answer (an answer block or a \\boxed{} content), so a bare expression is read as LaTeX; otherwise (the tail of a
    free-form completion) only math_verify's default extraction runs. [] past the deadline or the size guard."""
    if not text or not text.strip():
        return []
    _math_verify()
    try:
        return list(_parse_checked(text.strip(), answer))
    except _TimedOut:
        return []


class _TimedOut(Exception):
    """A parse or verify cut by the deadline: not memoised (it depends on the machine's load, not on the text)."""


@functools.lru_cache(maxsize=4096)
def _parse_checked(text: str, answer: bool) -> tuple:
    parsed = _within_deadline(_parse, text, answer, default=None)
    if parsed is None:
        raise _TimedOut
    return tuple(parsed) if parsed and _small_enough(parsed[0]) else ()


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str) -> tuple:
    """The parsed gold answer, cached (each gold is checked against G completions). Raises ValueError when
    math_verify cannot parse it: that is a data problem, not a wrong completion."""
    parse, _ = _math_verify()
    text = gold.strip()
    parsed = []
    if text:
        parsed = parse(f"${text}$", parsing_timeout=None) if is_bare_latex(text) else []
        parsed = parsed or parse(text, parsing_timeout=None)
    if not parsed:
        raise ValueError(f"gold math answer {gold!r} cannot be parsed by math_verify")
    return tuple(parsed)


def verify_parsed(gold: tuple, pred: list) -> bool:
    """math_verify's `verify(gold, pred)` (gold first) under the deadline; False for no prediction. Memoised: a
    wrong symbolic answer costs sympy's `simplify` (10-80 ms), and a group's completions often repeat one."""
    if not pred:
        return False
    try:
        return _verify_checked(gold, tuple(pred))
    except _TimedOut:
        return False


@functools.lru_cache(maxsize=4096)
def _verify_checked(gold: tuple, pred: tuple) -> bool:
    _, verify = _math_verify()
    result = _within_deadline(functools.partial(verify, timeout_seconds=None), list(gold), list(pred), default=None)
    if result is None:
        raise _TimedOut
    return bool(result)


def math_match(pred_text: str, gold: str) -> bool:
    """Whether the final answer `pred_text` equals `gold` by math_verify (both parsed LaTeX first when bare)."""
    return verify_parsed(parse_gold(gold), parse_math(pred_text))


# ---------------------------------------------------------------- the size guard


def _magnitude_ok(node) -> bool:
    """One node: numeric powers stay under MAX_RESULT_DIGITS digits, factorial-like arguments under 1000, symbolic
    powers under exponent 1000. Called children first, so evaluating a child numerically here is cheap."""
    import sympy

    if isinstance(node, sympy.Pow):
        base, exp = node.args
        if not exp.is_number:
            return True
        e = abs(complex(exp.evalf(15)))
        if not base.is_number:
            return e <= 1000
        b = abs(complex(base.evalf(15)))
        return b <= 1 or e * math.log10(b) <= MAX_RESULT_DIGITS
    if isinstance(
        node,
        (
            sympy.factorial,
            sympy.factorial2,
            sympy.subfactorial,
            sympy.binomial,
            sympy.gamma,
            sympy.RisingFactorial,
            sympy.FallingFactorial,
        ),
    ):
        return all(not a.is_number or abs(complex(a.evalf(15))) <= 1000 for a in node.args)
    return not isinstance(node, (sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit, sympy.Derivative))


def _small_enough(expr) -> bool:
    """Whether `verify` can handle the parsed prediction quickly: at most MAX_NODES nodes, each `_magnitude_ok`.
    Unevaluated sums, products, integrals and limits are restatements, not answers."""
    import sympy

    if not isinstance(expr, sympy.Basic):
        return True  # a string fallback or a matrix of plain entries
    nodes = []
    for node in sympy.preorder_traversal(expr):
        nodes.append(node)
        if len(nodes) > MAX_NODES:
            return False
    try:
        return all(_magnitude_ok(node) for node in reversed(nodes))  # children before parents
    except (TypeError, ValueError, OverflowError, ArithmeticError):
        return False
