"""Weighted composition of named rewards over a batch: components, total, counted failures, `reward/*` metrics.

A recipe is a dict name -> weight (reward.recipe). Each completion is parsed once (`Parsed`) for all components. An
exception, NaN or inf inside a reward becomes 0 for that completion and is recorded with the sample id; scoring never
crashes the run. The `judge` component is scored for the whole batch at once (`rewards/judge.py`), its requests in
flight while the other components run; a step whose judge fails too often raises `JudgeError`. Knows nothing of
models or configs.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.parsed import Parsed
from vlgrpo.rewards.registry import NO_JUDGE, RewardError, RewardFn, resolve_reward
from vlgrpo.types import ANSWER_TYPES, Sample

log = logging.getLogger(__name__)
JUDGE = "judge"

DEFAULT_RECIPES: dict[str, dict[str, float]] = {
    **{kind: {"accuracy": 1.0, "format": 0.5} for kind in ANSWER_TYPES},
    "box": {"iou": 1.0, "format": 0.5},
}
"""Default recipe per answer type: correctness 1.0 + format 0.5 (boxes: continuous IoU, a denser signal)."""


def default_recipe(answer_type: str) -> dict[str, float]:
    if answer_type not in DEFAULT_RECIPES:
        raise RewardError(f"answer_type {answer_type!r} has no default recipe; accepted: {', '.join(ANSWER_TYPES)}")
    return dict(DEFAULT_RECIPES[answer_type])


def check_recipe(recipe: dict[str, float]) -> dict[str, RewardFn]:
    """Resolve every name of a recipe and check its weight; errors name the `reward.recipe` entry."""
    if not recipe:
        raise RewardError("reward.recipe is empty: name at least one reward, e.g. {accuracy: 1.0, format: 0.5}")
    fns = {}
    for name, weight in recipe.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise RewardError(f"reward.recipe.{name}: the weight must be a finite number, got {weight!r}")
        try:
            fns[name] = resolve_reward(name)
        except RewardError as e:
            raise RewardError(f"reward.recipe.{name}: {e}") from None
    return fns


@dataclass
class RewardBatch:
    """Rewards of B*G completions: one list per named component, the weighted total, and what failed."""

    components: dict[str, list[float]]
    total: list[float]
    weights: dict[str, float]
    failures: list[tuple[str, str, str]] = field(default_factory=list)
    """(sample id, component name, error repr) of every reward that raised or returned NaN/inf (scored 0)."""
    verdicts: list = field(default_factory=list)
    """The judge's `Verdict` per completion (raw reply, error, cached) when the recipe names `judge`."""
    extra: dict[str, float] = field(default_factory=dict)
    """More `reward/*` metrics: the judge's requests, cache hits, failures, retries, latency and wait."""

    def metrics(self) -> dict[str, float]:
        """`reward/<name>` means, `reward/total` mean and `reward/failures` count."""
        n = max(len(self.total), 1)
        out = {f"reward/{name}": sum(values) / n for name, values in self.components.items()}
        out["reward/total"] = sum(self.total) / n
        out["reward/failures"] = float(len(self.failures))
        return {**out, **self.extra}


def _safe_call(
    fn: RewardFn, name: str, completion: Parsed, sample: Sample, ctx: RewardContext, failures: list
) -> float:
    try:
        value = float(fn(completion, sample, ctx))
    except Exception as e:  # noqa: BLE001 - any reward bug is a counted zero, never a crashed run
        failures.append((sample.id, name, repr(e)))
        log.debug("reward %s failed on sample %s: %r", name, sample.id, e)
        return 0.0
    if not math.isfinite(value):
        failures.append((sample.id, name, f"non-finite value {value!r}"))
        return 0.0
    return value


def score(
    completions: list[str],
    samples: list[Sample],
    recipe: dict[str, float],
    ctx: RewardContext,
    judge_check: bool = True,
    images_returned: list[int] | None = None,
) -> RewardBatch:
    """Score completions[i] against samples[i] (the caller repeats each prompt's sample G times). `judge_check`
    False: a judge failing on most completions is reported in the batch, not raised (`vlgrpo reward`).
    `images_returned[i]`: images completion i's tools returned (multi-turn rollouts; the `tool` reward reads it)."""
    if len(completions) != len(samples):
        raise ValueError(f"score: {len(completions)} completions but {len(samples)} samples (need one each)")
    fns = check_recipe(recipe)
    components: dict[str, list[float]] = {name: [] for name in fns}
    failures: list[tuple[str, str, str]] = []
    pending = None
    if JUDGE in fns:  # sent first: the judge's requests run while the other components are computed
        if ctx.judge is None:
            raise RewardError(NO_JUDGE)
        pending = ctx.judge.submit(completions, samples, ctx.answer_fallback)
    returned = images_returned or [0] * len(completions)
    for completion, sample, n in zip(completions, samples, returned):  # B*G
        view = Parsed(completion, ctx, n)  # parsed once, lazily, for every component (user rewards get the text)
        for name, fn in fns.items():
            if name != JUDGE:
                components[name].append(_safe_call(fn, name, view, sample, ctx, failures))
    batch = RewardBatch(components=components, total=[], weights=dict(recipe), failures=failures)
    if pending is not None:
        batch.verdicts, batch.extra = pending.result(judge_check)
        components[JUDGE] = [v.score for v in batch.verdicts]
        failures += [(s.id, JUDGE, f"judge: {v.error}") for s, v in zip(samples, batch.verdicts) if v.error]
    batch.total = [sum(recipe[name] * components[name][i] for name in fns) for i in range(len(completions))]
    return batch
