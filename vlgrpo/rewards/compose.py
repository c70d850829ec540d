"""Weighted composition of named rewards over a batch: components, total, counted failures, `reward/*` metrics.

A recipe is a dict name -> weight (reward.recipe). Each completion is parsed once (`Parsed`) for all components. An
exception, NaN or inf inside a reward becomes 0 for that completion and is recorded with the sample id; scoring never
crashes the run. Knows nothing of models or configs.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.parsed import Parsed
from vlgrpo.rewards.registry import RewardError, RewardFn, resolve_reward
from vlgrpo.types import ANSWER_TYPES, Sample

log = logging.getLogger(__name__)

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

    def metrics(self) -> dict[str, float]:
        """`reward/<name>` means, `reward/total` mean and `reward/failures` count."""
        n = max(len(self.total), 1)
        out = {f"reward/{name}": sum(values) / n for name, values in self.components.items()}
        out["reward/total"] = sum(self.total) / n
        out["reward/failures"] = float(len(self.failures))
        return out


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


def score(completions: list[str], samples: list[Sample], recipe: dict[str, float], ctx: RewardContext) -> RewardBatch:
    """Score completions[i] against samples[i] (the caller repeats each prompt's sample G times)."""
    if len(completions) != len(samples):
        raise ValueError(f"score: {len(completions)} completions but {len(samples)} samples (need one each)")
    fns = check_recipe(recipe)
    components: dict[str, list[float]] = {name: [] for name in fns}
    total: list[float] = []
    failures: list[tuple[str, str, str]] = []
    for completion, sample in zip(completions, samples):  # B*G
        view = Parsed(completion, ctx)  # parsed once, lazily, for every component (user rewards get the text)
        row = 0.0
        for name, fn in fns.items():
            value = _safe_call(fn, name, view, sample, ctx, failures)
            components[name].append(value)
            row += recipe[name] * value
        total.append(row)
    return RewardBatch(components=components, total=total, weights=dict(recipe), failures=failures)
