"""`vlgrpo eval --judge`: every suite's free-form answers also scored by the judge model training used
(`reward.judge`), so a checkpoint is measured the way it was rewarded.

Adds `eval/<suite>/judge_score` (the judge's mean score over the suite's samples with a gold answer that is not a
box) and, on each of their prediction rows, `judge_score`, `judge_reply` and `judge_error`. A judge failing on more
than its `max_failure_fraction` of the samples stops the eval with the endpoint named (`JudgeError`). Knows nothing
of models or engines.
"""

from __future__ import annotations

from vlgrpo.evals.suite import EvalResult
from vlgrpo.rewards.context import RewardContext
from vlgrpo.types import Completion, InputError, Sample


def judged(s: Sample) -> bool:
    """A sample the judge scores: a gold answer to compare with, not a box (IoU scores those)."""
    return bool(s.answer) and s.answer_type != "box"


def judge_suites(
    result: EvalResult, suites: dict[str, list[Sample]], completions: list[Completion], ctx: RewardContext
) -> None:
    """Score the suites' completions (in `suites` order, as `evaluate` decoded them) with ctx.judge, in place."""
    if ctx.judge is None:
        raise InputError("--judge needs a judge: reward.judge.base_url and reward.judge.model in the given config")
    rows = {(row["suite"], row["id"]): row for row in result.predictions}
    start, picked = 0, []
    for name, group in suites.items():
        picked += [(name, s, c) for s, c in zip(group, completions[start : start + len(group)]) if judged(s)]
        start += len(group)
    if not picked:
        raise InputError(f"--judge: no sample of the suites {', '.join(suites)} has a gold answer to judge against")
    batch = ctx.judge.submit([c.text for _, _, c in picked], [s for _, s, _ in picked], ctx.answer_fallback)
    verdicts, metrics = batch.result()
    scores: dict[str, list[float]] = {}
    for (name, s, _), v in zip(picked, verdicts):
        scores.setdefault(name, []).append(v.score)
        row = rows.get((name, s.id))
        if row is not None:
            row.update(judge_score=v.score, judge_reply=v.reply, judge_error=v.error)
    result.metrics.update({f"eval/{name}/judge_score": sum(v) / len(v) for name, v in scores.items()})
    result.info["judge"] = {
        "judged": {name: len(v) for name, v in scores.items()},
        "endpoint": ctx.judge.url,
        "model": ctx.judge.settings.model,
        "failures": int(metrics["reward/judge_failures"]),
        "requests": int(metrics["reward/judge_requests"]),
    }
