"""The `vstar` eval suite: V* Bench (Wu & Xie, 2023), multiple-choice questions about small details of large images,
in two categories (direct_attributes: an object's colour or material, 4 options; relative_position: where one object
is from another, 2 options). The Samples come from `evals/reasoning/loaders.py`'s
`load_vstar` (the published folders as they
are); the answer is the option letter our choice parser reads, or an option's text written out; accuracy overall and
per category. Knows nothing of models or engines.
"""

from __future__ import annotations

import re

from vlgrpo.evals.reasoning.files import VSTAR_CATEGORIES
from vlgrpo.evals.report import table
from vlgrpo.evals.suite import Scores, Selection, Suite, prediction_row
from vlgrpo.evals.vqa import ungated
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.extract import extract_answer
from vlgrpo.rewards.verifiable import parse_choice
from vlgrpo.types import Completion, Sample

NAME = "vstar"


def _words(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def vstar_choice(read: str | None, options: list[str]) -> str | None:
    """The option letter an answer names: the letter our choice parser reads ("B", "(B) white", "Answer: B"), else
    the letter of the option whose text the answer is, word for word (case and punctuation aside: "White." for
    "white"), since V*'s own scoring compares the option texts, never letters. None when it names neither."""
    letter = parse_choice(read)
    if letter is not None or not read:
        return letter
    said = _words(read)
    hits = [chr(ord("A") + i) for i, text in enumerate(options) if _words(text) == said]
    return hits[0] if len(hits) == 1 else None


def select(sel: Selection) -> list[Sample]:
    """The V* Samples of the data (read by `load_vstar` when --data is a V* folder), the first `max_samples`."""
    return [s for s in sel.samples if s.meta.get("benchmark") == NAME][: sel.max_samples]


def score(samples: list[Sample], completions: list[Completion], ctx: RewardContext, parser: str) -> Scores:
    """accuracy over every question (as vstar_bench_eval.py prints its overall number: pooled, not the mean of the
    two categories) and accuracy_<category>; each row adds `extracted`, `parsed` (the letter read) and `category`."""
    if not samples:
        return {}, {"": 0}, []
    ctx = ungated(ctx)
    reads = [extract_answer(c.text, ctx.answer_fallback) for c in completions]
    parsed = [vstar_choice(r, s.meta["options"]) for r, s in zip(reads, samples)]
    correct = [p is not None and p == s.answer for p, s in zip(parsed, samples)]
    by_group: dict[str, list[bool]] = {"": correct}
    for category in VSTAR_CATEGORIES:
        hits = [ok for ok, s in zip(correct, samples) if s.meta["category"] == category]
        if hits:
            by_group[category] = hits
    metrics = {("accuracy" if g == "" else f"accuracy_{g}"): sum(v) / len(v) for g, v in by_group.items()}
    rows = [
        {
            **prediction_row(NAME, s, c, s.answer),
            "category": s.meta["category"],
            "gold_option": s.meta["answer"],
            "extracted": read,
            "parsed": letter,
            "correct": ok,
            "answered": bool(read and read.strip()),
        }
        for s, c, read, letter, ok in zip(samples, completions, reads, parsed, correct)
    ]
    return metrics, {g: len(v) for g, v in by_group.items()}, rows


def report(metrics: dict, counts: dict, info: dict) -> list[str]:
    rows = [["all", counts[NAME], metrics[f"eval/{NAME}/accuracy"]]]
    for category in VSTAR_CATEGORIES:
        if f"{NAME}/{category}" in counts:
            rows.append([category, counts[f"{NAME}/{category}"], metrics[f"eval/{NAME}/accuracy_{category}"]])
    note = (
        "Generated and parsed (the option letter, or an option's text); V*'s own eval picks the option of highest "
        "likelihood instead: docs/evals.md#v-bench---suite-vstar."
    )
    return ["## V* Bench accuracy", "", *table(["category", "n", "accuracy"], rows), "", note]


SUITE = Suite(
    NAME,
    "a V* Bench folder (direct_attributes/ and relative_position/: <name>.jpg with <name>.json holding question and "
    "options)",
    select,
    score,
    report,
)
