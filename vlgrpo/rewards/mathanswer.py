"""Math answers through math_verify: which text is parsed, LaTeX first for bare expressions, and the bounds.

math_verify's default extraction reads bare LaTeX by its leading number (`2\\sqrt{2}` -> 2), so an answer or gold
without delimiters is parsed as `$…$` first. Bounds on one check: a length cap on what reaches the parser, a size
guard before `verify` (a 14-character power tower would take hours in sympy), and a sub-second deadline on the main
thread. Knows nothing of completions' tags, samples, models or configs.
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


@functools.cache
def _math_verify():
    """math_verify's (parse, verify), imported and warmed up once, outside any deadline (the import and the first
    LaTeX parse take about 0.6 s). Its one-time "timeout is disabled" warnings are silenced: the deadline above is
    the timeout."""
    import math_verify.grader
    import math_verify.parser

    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.verify(math_verify.parse("$1$", parsing_timeout=None), math_verify.parse("1"), timeout_seconds=None)
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
    parsed = _within_deadline(_parse, text.strip(), answer, default=[])
    return parsed if parsed and _small_enough(parsed[0]) else []


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
    """math_verify's `verify(gold, pred)` (gold first) under the deadline; False for no prediction."""
    if not pred:
        return False
    _, verify = _math_verify()
    return bool(_within_deadline(functools.partial(verify, timeout_seconds=None), list(gold), pred, default=False))


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
    if isinstance(node, (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.binomial, sympy.gamma,
                         sympy.RisingFactorial, sympy.FallingFactorial)):  # fmt: skip
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
