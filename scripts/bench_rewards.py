"""Reward parser timing: every parser on ~100 kB adversarial completions, and scoring throughput on normal ones.

The issue's bound: a 100 kB adversarial completion (50,000 "<answer>" or "[1," repeats, ...) scores in < 5 ms per
parser, i.e. no catastrophic backtracking. Usage: OMP_NUM_THREADS=1 python scripts/bench_rewards.py [--json].
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


def adversarial(size: int) -> dict[str, str]:
    """Completions of about `size` characters built to provoke backtracking or quadratic scans, plus the issue's
    two literal examples: 50,000 "<answer>" (400 kB) and 50,000 "[1," (150 kB)."""
    def rep(unit: str) -> str:
        return unit * max(1, size // len(unit))

    return {
        "50,000 <answer>": "<answer>" * 50_000,
        "50,000 [1,": "[1," * 50_000,
        "<answer>": rep("<answer>"),
        "[1,": rep("[1,"),
        "(1,": rep("(1,"),
        "(1,2),": rep("(1,2),"),
        '"bbox_2d": [1,': rep('"bbox_2d": [1,'),
        "\\boxed{": rep("\\boxed{"),
        "{ after one boxed": "\\boxed{" + rep("{"),
        "digits": rep("1"),
        "1,000,": rep("1,000,"),
        "1.1.": rep("1."),
        "spaces then x": rep(" ") + "x",
        "A or B ": rep("A or B "),
        "B B ": rep("B "),
        "answer answer": rep("answer "),
        "answer: spaces": "answer" + rep(" "),
        "yes/no/": rep("yes/no/"),
        "<think></think>": rep("<think></think>"),
        "newlines": rep("a\n"),
        "unicode": rep("é漢\u2028"),
    }


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


def time_call(fn, arg, repeat: int) -> float:
    """Median seconds of fn(arg) over `repeat` runs."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_parsers(size: int, repeat: int) -> dict[str, dict]:
    inputs = adversarial(size)
    out = {}
    for name, fn in PARSERS.items():
        per_input = {label: time_call(fn, text, repeat) for label, text in inputs.items()}
        worst = max(per_input, key=per_input.get)
        out[name] = {"worst_ms": per_input[worst] * 1e3, "worst_input": worst}
    return out


def bench_score(n: int) -> dict[str, float]:
    """Throughput of score() with the default recipes on realistic completions (no math: that is sympy's time)."""
    ctx = RewardContext(box_format="qwen2_5")
    cases = [
        (Sample("c", "How many?", "3", "number"), "<think>I count three.</think><answer>3</answer>"),
        (Sample("t", "Colour?", "red", "text"), "<think>It is red.</think><answer>Red</answer>"),
        (Sample("y", "Is there?", "no", "yesno"), "<think>none seen</think><answer>No</answer>"),
        (Sample("b", "Locate.", None, "box", boxes=[[10, 10, 50, 50]], image_size=(112, 112)),
         '<think>top left</think><answer>[{"bbox_2d": [12, 9, 51, 48], "label": "red circle"}]</answer>'),
    ]  # fmt: skip
    samples = [cases[i % len(cases)][0] for i in range(n)]
    completions = [cases[i % len(cases)][1] for i in range(n)]
    score(completions[:8], samples[:8], {"accuracy": 1.0}, ctx)  # warm-up: lazy imports (smart_resize)
    t0 = time.perf_counter()
    score(completions, samples, {"accuracy": 1.0, "format": 0.5, "iou": 1.0}, ctx)
    dt = time.perf_counter() - t0
    big = adversarial(100_000)
    t1 = time.perf_counter()
    for text in big.values():
        for sample, _ in cases:
            score([text], [sample], {"accuracy": 1.0, "format": 0.5, "iou": 1.0, "giou": 1.0}, ctx)
    worst_100k = (time.perf_counter() - t1) / (len(big) * len(cases))
    return {
        "completions_per_s": n / dt,
        "us_per_completion": dt / n * 1e6,
        "mean_ms_100kB_adversarial": worst_100k * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=100_000, help="characters of each adversarial completion")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--n", type=int, default=20_000, help="completions in the throughput run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    parsers = bench_parsers(args.size, args.repeat)
    throughput = bench_score(args.n)
    if args.json:
        print(json.dumps({"parsers": parsers, "score": throughput}, indent=2))
        return
    n_inputs = len(adversarial(args.size))
    print(f"worst-case time per parser over {n_inputs} adversarial inputs of >= {args.size // 1000} kB (median of "
          f"{args.repeat} runs)")
    for name, r in parsers.items():
        flag = "" if r["worst_ms"] < 5 else "  <-- over 5 ms"
        print(f"  {name:<22} {r['worst_ms']:8.3f} ms   (worst: {r['worst_input']}){flag}")
    print(f"score(): {throughput['completions_per_s']:,.0f} completions/s "
          f"({throughput['us_per_completion']:.1f} us each, accuracy+format+iou); "
          f"{throughput['mean_ms_100kB_adversarial']:.2f} ms mean per 100 kB adversarial completion, 4 rewards")


if __name__ == "__main__":
    main()
