"""VQA accuracy by answer type (number, choice, yes/no, text, math) and by task.

Correctness is the rewards module's `accuracy` (answer extraction with its fallbacks, then the verifiable matcher of
the sample's answer_type), with the format gate off: an eval measures the answer, not the output format.
The `vqa` eval suite (`SUITE`). Knows nothing of models, engines or files.
"""

from __future__ import annotations

import dataclasses

from vlgrpo.evals.report import groups, label, table
from vlgrpo.evals.suite import Scores, Selection, Suite, prediction_row
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.extract import answer_region, extract_answer
from vlgrpo.rewards.registry import accuracy
from vlgrpo.types import Completion, InputError, Sample

VQA_TYPES = ("number", "choice", "yesno", "text", "math")


def ungated(ctx: RewardContext) -> RewardContext:
    """The context evals judge answers with: reward.gate_accuracy_on_format switched off."""
    return dataclasses.replace(ctx, gate_accuracy_on_format=False) if ctx.gate_accuracy_on_format else ctx


def check_gold(samples: list[Sample], ctx: RewardContext, source: str) -> None:
    """Fail before any decoding when a gold answer cannot be verified (a data problem, named with its sample)."""
    ctx = ungated(ctx)
    for s in samples:
        if s.answer_type not in VQA_TYPES:
            raise InputError(f"{source}: sample '{s.id}' has answer_type {s.answer_type!r}; VQA accepts {VQA_TYPES}")
        try:
            accuracy("", s, ctx)  # parses the gold answer; an empty completion is simply wrong
        except ValueError as e:
            raise InputError(f"{source}: {e}") from None


def judge(completion: str, sample: Sample, ctx: RewardContext) -> tuple[bool, str | None]:
    """(correct, the answer read from the completion) for one VQA sample; ctx must be `ungated`."""
    if sample.answer_type == "math":
        read = answer_region(completion)
    else:
        read = extract_answer(completion, ctx.answer_fallback)
    return accuracy(completion, sample, ctx) == 1.0, read


def vqa_metrics(samples: list[Sample], correct: list[bool]) -> tuple[dict[str, float], dict[str, int]]:
    """(metrics, counts): accuracy overall, `accuracy_<answer_type>` per type present (VQA_TYPES order) and
    `accuracy_task_<task>` per task present (sorted); counts under "", "<answer_type>" and "task_<task>"."""
    if not samples or len(samples) != len(correct):
        raise ValueError(f"need one verdict per sample; got {len(correct)} for {len(samples)} samples")
    groups: dict[str, list[bool]] = {"": list(correct)}
    for kind in VQA_TYPES:
        hits = [c for s, c in zip(samples, correct) if s.answer_type == kind]
        if hits:
            groups[kind] = hits
    for task in sorted({s.task for s in samples if s.task}):
        groups[f"task_{task}"] = [c for s, c in zip(samples, correct) if s.task == task]
    metrics = {("accuracy" if g == "" else f"accuracy_{g}"): sum(v) / len(v) for g, v in groups.items()}
    return metrics, {g: len(v) for g, v in groups.items()}


def select(sel: Selection) -> list[Sample]:
    """The samples with a verifiable answer type, the first `max_samples`; their gold answers checked."""
    samples = [s for s in sel.samples if s.answer_type in VQA_TYPES][: sel.max_samples]
    if sel.ctx is not None and samples:
        check_gold(samples, sel.ctx, str(sel.data))
    return samples


def score(samples: list[Sample], completions: list[Completion], ctx: RewardContext, parser: str) -> Scores:
    ctx = ungated(ctx)
    verdicts = [judge(c.text, s, ctx) for s, c in zip(samples, completions)]
    metrics, counts = vqa_metrics(samples, [ok for ok, _ in verdicts])
    rows = [
        {
            **prediction_row("vqa", s, c, s.answer),
            "answer_type": s.answer_type,
            "extracted": read,
            "correct": ok,
            "answered": bool(read and read.strip()),
        }
        for s, c, (ok, read) in zip(samples, completions, verdicts)
    ]
    return metrics, counts, rows


def report(metrics: dict, counts: dict, info: dict) -> list[str]:
    rows = [["all", counts["vqa"], metrics["eval/vqa/accuracy"]]]
    rows += [[label(g), counts[f"vqa/{g}"], metrics[f"eval/vqa/accuracy_{g}"]] for g in groups(counts, "vqa")]
    return ["## VQA accuracy", "", *table(["group", "n", "accuracy"], rows)]


SUITE = Suite("vqa", f"samples of answer_type {'/'.join(VQA_TYPES)}", select, score, report)
