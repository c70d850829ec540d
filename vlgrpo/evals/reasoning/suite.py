"""The eval suites of the reasoning benchmarks: `MATHVISTA`, `GEOMETRY3K`, `SUPERCLEVR` and `MMMU`, one registry line
each. A suite runs on the Samples its loader (`loaders.py`) read from the published file, reads each answer
with our parsers (answer block, \\boxed{}, fallbacks) and scores it by the benchmark's own rule
(`evals/reasoning/score.py`); accuracy overall and per published category. Knows nothing of models or engines.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from vlgrpo.evals.reasoning.loaders import load_benchmark
from vlgrpo.evals.reasoning.score import (
    count_value,
    mathvista_gold,
    mathvista_normalize,
    mmmu_choice,
    mmmu_open_correct,
    mmmu_open_predictions,
    r1v_count,
)
from vlgrpo.evals.report import table
from vlgrpo.evals.suite import Scores, Selection, Suite, prediction_row
from vlgrpo.evals.vqa import check_gold, ungated
from vlgrpo.evals.vqa import judge as vqa_judge
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.extract import extract_answer
from vlgrpo.types import Completion, Sample


class Verdict(NamedTuple):
    correct: bool
    read: str | None
    """The answer read from the completion (None: nothing to read)."""
    extra: dict
    """Row fields; a bool among them is also a metric, `accuracy_<key>`, over all the suite's samples."""


def _slug(text: str) -> str:
    return re.sub(r"\W+", "_", str(text).strip()).strip("_").lower()


# ---------------------------------------------------------------- one completion, one verdict


def judge_mathvista(text: str, s: Sample, ctx: RewardContext) -> Verdict:
    m = s.meta
    read = extract_answer(text, ctx.answer_fallback)
    pred = mathvista_normalize(read, m["choices"], m["question_type"], m["answer_type"], m["precision"])
    return Verdict(
        pred is not None and pred == mathvista_gold(m["answer"], m["answer_type"]), read, {"normalized": pred}
    )


def judge_geometry3k(text: str, s: Sample, ctx: RewardContext) -> Verdict:
    """math_verify equivalence with the gold, through the rewards' math verifier (what vqa does for math)."""
    correct, read = vqa_judge(text, s, ctx)
    return Verdict(correct, read, {})


def judge_superclevr(text: str, s: Sample, ctx: RewardContext) -> Verdict:
    """The count read by our parsers equals the gold; `r1v_rule` is R1-V's own regex on the whole completion."""
    read = extract_answer(text, ctx.answer_fallback)
    gold = int(s.answer or 0)
    return Verdict(count_value(read) == gold, read, {"r1v_rule": r1v_count(text) == gold})


def judge_mmmu(text: str, s: Sample, ctx: RewardContext) -> Verdict:
    m = s.meta
    read = extract_answer(text, ctx.answer_fallback)
    if m["question_type"] == "multiple-choice":
        pred = mmmu_choice(read, m["options"])
        return Verdict(pred is not None and pred == m["answer"], read, {"parsed": pred})
    preds = mmmu_open_predictions(read)
    return Verdict(mmmu_open_correct(m["answer"], preds), read, {"parsed": preds})


MMMU_DISCIPLINES = {
    "Art and Design": ("Art", "Art_Theory", "Design", "Music"),
    "Business": ("Accounting", "Economics", "Finance", "Manage", "Marketing"),
    "Science": ("Biology", "Chemistry", "Geography", "Math", "Physics"),
    "Health and Medicine": (
        "Basic_Medical_Science",
        "Clinical_Medicine",
        "Diagnostics_and_Laboratory_Medicine",
        "Pharmacy",
        "Public_Health",
    ),
    "Humanities and Social Science": ("History", "Literature", "Sociology", "Psychology"),
    "Tech and Engineering": (
        "Agriculture",
        "Architecture_and_Engineering",
        "Computer_Science",
        "Electronics",
        "Energy_and_Power",
        "Materials",
        "Mechanical_Engineering",
    ),
}
"""MMMU's own grouping of its 30 subjects (mmmu/utils/data_utils.py DOMAIN_CAT2SUB_CAT)."""
_DISCIPLINE = {subject: d for d, subjects in MMMU_DISCIPLINES.items() for subject in subjects}


def mathvista_groups(s: Sample) -> list[str]:
    """question type, `task_<metadata.task>` and one `skill_<skill>` per skill (a row counts in each of its skills,
    as MathVista's calculate_score.py counts them)."""
    m = s.meta
    return [
        m["question_type"],
        *([f"task_{_slug(m['task'])}"] if m.get("task") else []),
        *(f"skill_{_slug(k)}" for k in m.get("skills", [])),
    ]


def mmmu_groups(s: Sample) -> list[str]:
    subject = s.meta.get("subject", "")
    discipline = _DISCIPLINE.get(subject)
    return [*([f"discipline_{_slug(discipline)}"] if discipline else []), f"subject_{subject or 'unknown'}"]


# ---------------------------------------------------------------- the suites


def _select(name: str, check_math: bool = False) -> Callable[[Selection], list[Sample]]:
    def select(sel: Selection) -> list[Sample]:
        """The samples read from `name`'s published file, the first `max_samples`; math golds checked. When a data
        preset read the file as Samples for the other suites (an EasyR1-shaped file), the suite reads it itself."""
        samples = [s for s in sel.samples if s.meta.get("benchmark") == name]
        if not samples and sel.source.kind == "rows" and sel.source.benchmark == name:
            samples = load_benchmark(sel.data, name)
        samples = samples[: sel.max_samples]
        if check_math and sel.ctx is not None and samples:
            check_gold(samples, sel.ctx, str(sel.data))
        return samples

    return select


def _score(
    name: str, judge: Callable[[str, Sample, RewardContext], Verdict], groups: Callable[[Sample], list[str]]
) -> Callable[..., Scores]:
    def score(samples: list[Sample], completions: list[Completion], ctx: RewardContext, parser: str) -> Scores:
        if not samples:  # nothing to score: no metric, a count of 0 (`select_suites` reports why it is empty)
            return {}, {"": 0}, []
        ctx = ungated(ctx)
        verdicts = [judge(c.text, s, ctx) for s, c in zip(samples, completions)]
        by_group: dict[str, list[bool]] = {"": [v.correct for v in verdicts]}
        for s, v in zip(samples, verdicts):
            for g in groups(s):
                by_group.setdefault(g, []).append(v.correct)
        for key in (k for k, value in verdicts[0].extra.items() if isinstance(value, bool)):
            by_group[key] = [v.extra[key] for v in verdicts]
        by_group = {g: by_group[g] for g in sorted(by_group)}  # "" (all) first, then the groups by name
        metrics = {("accuracy" if g == "" else f"accuracy_{g}"): sum(v) / len(v) for g, v in by_group.items()}
        counts = {g: len(v) for g, v in by_group.items()}
        rows = [
            {
                **prediction_row(name, s, c, s.meta.get("answer", s.answer)),
                "extracted": v.read,
                "correct": v.correct,
                "answered": bool(v.read and v.read.strip()),
                **v.extra,
            }
            for s, c, v in zip(samples, completions, verdicts)
        ]
        return metrics, counts, rows

    return score


def _report(name: str, title: str) -> Callable[[dict, dict, dict], list[str]]:
    def report(metrics: dict, counts: dict, info: dict) -> list[str]:
        rows = [["all", counts[name], metrics[f"eval/{name}/accuracy"]]]
        for group in (key[len(name) + 1 :] for key in counts if key.startswith(f"{name}/")):
            accuracy = metrics.get(f"eval/{name}/accuracy_{group}")
            if accuracy is not None:
                rows.append([group.replace("_", " ", 1), counts[f"{name}/{group}"], accuracy])
        lines = [f"## {title}", "", *table(["group", "n", "accuracy"], rows), ""]
        return lines + [f"Published scores to compare with, and how they were measured: evals/{name}.yaml."]

    return report


def _suite(name: str, title: str, needs: str, judge, groups=lambda s: [], check_math: bool = False) -> Suite:
    return Suite(name, needs, _select(name, check_math), _score(name, judge, groups), _report(name, title))


MATHVISTA = _suite(
    "mathvista",
    "MathVista accuracy (MathVista's normalisation)",
    "a MathVista file in its published "
    "shape (testmini.json or the testmini parquet: pid, question, choices, answer, question_type, "
    "answer_type, ...)",
    judge_mathvista,
    mathvista_groups,
)
GEOMETRY3K = _suite(
    "geometry3k",
    "Geometry3K accuracy (math_verify equivalence)",
    "EasyR1's Geometry3K file (images, problem, answer)",
    judge_geometry3k,
    check_math=True,
)
SUPERCLEVR = _suite(
    "superclevr",
    "SuperCLEVR counting accuracy (exact count)",
    "R1-V's SuperCLEVR test file (JSONL: image_path, question, ground_truth)",
    judge_superclevr,
)
MMMU = _suite(
    "mmmu",
    "MMMU accuracy (MMMU's response parsing)",
    "MMMU rows in their published shape (id, question, options, answer, image_1..image_7)",
    judge_mmmu,
    mmmu_groups,
)
