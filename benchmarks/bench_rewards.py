"""Reward timing: one `score()` with every built-in reward on ~100 kB adversarial completions, per answer type
(the bound: < 5 ms per completion), each parser alone on the same inputs, and throughput on normal completions.

Each time is the median of --repeat runs on one thread. math_verify's own caches are cleared before every run, so a
repeated input is parsed again (a cached parse would time nothing); gold answers are parsed before timing, as
score() does once per prompt for its G completions.
Usage: OMP_NUM_THREADS=1 python benchmarks/bench_rewards.py [--json] (wrap in `flock /tmp/cpu-heavy.lock` when shared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from vlgrpo.rewards import RewardContext, score
from vlgrpo.rewards.boxes import parse_boxes
from vlgrpo.rewards.extract import answer_block, answer_line, extract_answer, last_boxed, last_line
from vlgrpo.rewards.format import answer_only_ok, think_answer_ok
from vlgrpo.rewards.verifiable import parse_choice, parse_number, parse_yesno, text_match
from vlgrpo.types import Sample

RECIPE = {"accuracy": 1.0, "format": 0.5, "iou": 1.0, "iou_threshold": 1.0, "iou@0.75": 1.0, "giou": 1.0}
"""Every built-in reward (iou@<tau> once)."""
SAMPLES = {
    "number": Sample("n", "How many?", "-3", "number"),
    "choice": Sample("c", "Which?", "B", "choice"),
    "yesno": Sample("y", "Is there?", "yes", "yesno"),
    "text": Sample("t", "Colour?", "red", "text"),
    "math": Sample("m", "Solve.", r"\frac{1}{2}", "math"),
    "box": Sample("b", "Locate.", None, "box", boxes=[[10, 10, 50, 50], [60, 60, 90, 90]], image_size=(1920, 1080)),
}


def adversarial(size: int) -> dict[str, str]:
    """Completions of about `size` characters built to provoke backtracking, quadratic scans or slow math parsing,
    plus the issue's literal examples (50,000 "<answer>" = 400 kB, 50,000 "[1," = 150 kB)."""

    def rep(unit: str) -> str:
        return unit * max(1, size // len(unit))

    units = [
        "<answer>",
        "[1,",
        "(1,",
        "(1,2),",
        '"bbox_2d": [1,',
        "\\boxed{",
        "1",
        "1,000,",
        "1.",
        "A or B ",
        "B ",
        "answer ",
        "yes/no/",
        "<think></think>",
        "a\n",
        "é漢\u2028",
        "1 ",
        "1+",
        "x^",
        "$x^",
        "$1$ ",
        "$",
        "−",
        "\\sqrt{",
        "\\frac{1}{",
        "(",
        "{",
        "i",
        "answer: İ\n",
        "İ Answer: 3\n",
        "yes and no ",
        "\\left(",
    ]
    out = {
        "50,000 <answer>": "<answer>" * 50_000,
        "50,000 [1,": "[1," * 50_000,
        "spaces then x": rep(" ") + "x",
        "answer: spaces": "answer" + rep(" "),
        "{ after one boxed": "\\boxed{" + rep("{"),
    }
    out.update({unit: rep(unit) for unit in units})
    for unit in ("1 ", "x^", "a", "\\sqrt{", "[1, "):  # runaway text inside one answer block / one \boxed{}
        out[f"<answer>{unit}…</answer>"] = f"<think>t</think><answer>{rep(unit)}</answer>"
        out[f"\\boxed{{{unit}…}}"] = f"\\boxed{{{rep(unit)[:1990]}}}"
    out["İ then tags"] = rep("İ") + "<think>t</think><answer>3</answer>"
    return out


def realistic_tails(size: int) -> dict[str, str]:
    """~`size` characters of reasoning, then a real answer of each kind (what a long but honest completion costs)."""
    reasoning = "<think>" + "Let me look at the image again.\n" * (size // 32) + "</think>"
    answers = {
        "number": "−3",
        "choice": "(B)",
        "yesno": "Yes",
        "text": "red",
        "math-frac": r"\frac{1}{2}",
        "math-interval": r"\left(\frac{1}{2}, \frac{\sqrt{3}}{2}\right)",
        "math-poly": "2x^3 + 3x^2 - x + 7",
        "box": '[{"bbox_2d": [10, 10, 50, 50]}, {"bbox_2d": [61, 60, 91, 90]}]',
    }
    return {f"long + {k}": f"{reasoning}<answer>{v}</answer>" for k, v in answers.items()}


def clear_math_caches() -> None:
    """math_verify and vlgrpo memoise parsed answers (lru_cache); clear both so a repeated input is really re-parsed.
    ANTLR's prediction DFA stays warm, as it does in a training run after the first few answers."""
    import math_verify.parser

    from vlgrpo.rewards import mathanswer

    mathanswer._parse_checked.cache_clear()
    for value in vars(math_verify.parser).values():
        if hasattr(value, "cache_clear"):
            value.cache_clear()


def time_call(fn, arg, repeat: int, clear: bool = False) -> float:
    """Median seconds of fn(arg) over `repeat` runs."""
    times = []
    for _ in range(repeat):
        if clear:
            clear_math_caches()
        t0 = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_score(inputs: dict[str, str], repeat: int) -> dict[str, dict]:
    """Per answer type: the worst median time of one score() with RECIPE over `inputs`."""
    ctx = RewardContext(box_format="qwen2_5")
    out = {}
    for kind, sample in SAMPLES.items():
        score(["<answer>1</answer>"], [sample], RECIPE, ctx)  # warm-up: imports, the gold parse
        per_input = {
            label: time_call(lambda t: score([t], [sample], RECIPE, ctx), text, repeat, clear=True)  # noqa: B023
            for label, text in inputs.items()
        }
        worst = max(per_input, key=per_input.get)
        out[kind] = {"worst_ms": per_input[worst] * 1e3, "worst_input": worst}
    return out


PARSERS = {
    "answer_block": answer_block,
    "extract_answer": extract_answer,
    "last_boxed": last_boxed,
    "answer_line": answer_line,
    "last_line": last_line,
    "think_answer_ok": think_answer_ok,
    "answer_only_ok": answer_only_ok,
    "parse_number": parse_number,
    "parse_choice": parse_choice,
    "parse_yesno": parse_yesno,
    "text_match": lambda t: text_match(t, "red"),
    **{f"parse_boxes[{f}]": (lambda t, f=f: parse_boxes(t, f)) for f in ("qwen2", "qwen2_5", "qwen3", "plain")},
}


def bench_parsers(inputs: dict[str, str], repeat: int) -> dict[str, dict]:
    out = {}
    for name, fn in PARSERS.items():
        per_input = {label: time_call(fn, text, repeat) for label, text in inputs.items()}
        worst = max(per_input, key=per_input.get)
        out[name] = {"worst_ms": per_input[worst] * 1e3, "worst_input": worst}
    return out


def bench_throughput(n: int) -> dict[str, float]:
    """Completions per second of score() with accuracy + format + iou on short, normal completions (no math)."""
    ctx = RewardContext(box_format="qwen2_5")
    cases = [
        (SAMPLES["number"], "<think>I count three.</think><answer>-3</answer>"),
        (SAMPLES["text"], "<think>It is red.</think><answer>Red</answer>"),
        (SAMPLES["yesno"], "<think>one seen</think><answer>Yes</answer>"),
        (SAMPLES["box"], '<think>top left</think><answer>[{"bbox_2d": [12, 9, 51, 48]}]</answer>'),
    ]
    samples = [cases[i % len(cases)][0] for i in range(n)]
    completions = [cases[i % len(cases)][1] for i in range(n)]
    score(completions[:8], samples[:8], {"accuracy": 1.0}, ctx)  # warm-up: lazy imports (smart_resize)
    t0 = time.perf_counter()
    score(completions, samples, {"accuracy": 1.0, "format": 0.5, "iou": 1.0}, ctx)
    dt = time.perf_counter() - t0
    return {"completions_per_s": n / dt, "us_per_completion": dt / n * 1e6}


MATH_ANSWERS = [
    r"\frac{1}{2}",
    r"2\sqrt{3}",
    "x^2 - 1",
    "2x^3 + 3x^2 - x + 7",
    r"\left(\frac{1}{2}, \frac{\sqrt{3}}{2}\right)",
    "[0, 1)",
    r"\{1, 2, 3\}",
    "y = 2x + 1",
    r"\pi r^2",
    r"e^{i\pi}",
    r"\sin^2 x + \cos^2 x",
    r"\log_2 8",
    r"\frac{a+b}{c-d}",
    r"\dfrac{3}{4}",
    r"10\%",
    "0.4",
    "-3",
]
"""Real math answers: a wrong one costs a parse and sympy's `simplify` in verify, a right one the parse."""


def bench_math_answers(repeat: int) -> dict[str, dict]:
    """One answer-block math check per answer, math_verify's and vlgrpo's caches cleared (sympy's own cache and
    ANTLR's DFA stay warm, as in a training run), wrong
    (gold 1/2... or 7) and right (gold = the answer itself), with ANTLR's two-stage parsing and with full LL only
    (math_verify as shipped): the same inputs in one run."""
    from latex2sympy2_extended import latex2sympy2 as l2s

    from vlgrpo.rewards import mathanswer

    mathanswer._math_verify()
    two_stage = l2s._Latex2Sympy.create_parser

    def check(answer: str, gold: str) -> None:
        clear_math_caches()
        mathanswer._verify_checked.cache_clear()
        mathanswer.math_match(answer, gold)

    out = {}
    for mode, factory in (("two-stage (vlgrpo)", two_stage), ("full LL (as shipped)", two_stage.__wrapped__)):
        l2s._Latex2Sympy.create_parser = factory
        try:
            for case in ("wrong", "right"):
                per_input = {
                    a: time_call(
                        lambda a: check(a, a if case == "right" else ("7" if a == r"\frac{1}{2}" else r"\frac{1}{2}")),  # noqa: B023
                        a,
                        repeat,
                    )
                    for a in MATH_ANSWERS
                }
                worst = max(per_input, key=per_input.get)
                out[f"{mode}, {case}"] = {
                    "worst_ms": per_input[worst] * 1e3,
                    "worst_input": worst,
                    "median_ms": statistics.median(per_input.values()) * 1e3,
                }
        finally:
            l2s._Latex2Sympy.create_parser = two_stage
    return out


def _table(title: str, rows: dict[str, dict], bound: float | None) -> list[str]:
    lines = [title]
    for name, r in rows.items():
        flag = "  <-- over 5 ms" if bound is not None and r["worst_ms"] >= bound else ""
        lines.append(f"  {name:<22} {r['worst_ms']:9.3f} ms   (worst: {r['worst_input']}){flag}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=100_000, help="characters of each adversarial completion")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--n", type=int, default=20_000, help="completions in the throughput run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    inputs, honest = adversarial(args.size), realistic_tails(args.size)
    result = {
        "score_adversarial": bench_score(inputs, args.repeat),
        "score_realistic": bench_score(honest, args.repeat),
        "parsers": bench_parsers(inputs, args.repeat),
        "throughput": bench_throughput(args.n),
        "math_answers": bench_math_answers(args.repeat),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    lines = _table(
        f"one score() with {', '.join(RECIPE)}: worst of {len(inputs)} adversarial inputs of >= "
        f"{args.size // 1000} kB, median of {args.repeat} (bound 5 ms)",
        result["score_adversarial"],
        5.0,
    )
    lines += _table(
        f"the same on {len(honest)} long completions ending in a real answer (math: math_verify's "
        "LaTeX parser, not the length)",
        result["score_realistic"],
        None,
    )
    lines += _table("each parser alone, worst adversarial input", result["parsers"], 5.0)
    lines += _table(
        f"math answers ({len(MATH_ANSWERS)} real ones): one check, answer caches cleared; median over the "
        "answers in brackets",
        {
            k: {**v, "worst_input": f"{v['worst_input']}; median {v['median_ms']:.2f} ms"}
            for k, v in result["math_answers"].items()
        },
        None,
    )
    t = result["throughput"]
    lines.append(
        f"score() on short completions: {t['completions_per_s']:,.0f} completions/s "
        f"({t['us_per_completion']:.1f} us each, accuracy + format + iou)"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
