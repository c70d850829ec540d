"""Phases 1-4 of a GRPO step as rounds: sample groups, score them, and with dynamic sampling drop the groups whose
rewards all tie and top the batch up with fresh prompts. Knows the rounds' bookkeeping and the reward shaping; where
a round's groups come from (colocated or split rollouts) is the caller's `sample_round`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vlgrpo import grpo
from vlgrpo.rewards import score
from vlgrpo.trainer.metrics import UnionMeans, mean_metrics
from vlgrpo.trainer.ranks import max_over_ranks
from vlgrpo.types import RolloutGroup

SampleRound = Callable[[int, int, list], tuple[list[RolloutGroup], list, list[float]]]
"""(need, round number, parts) -> (groups, features, rewards [need*G]); appends (metrics, completions) to parts."""


@dataclass
class Scored:
    """Rollout groups of one step with their rewards (after shaping) and the step's reward metrics."""

    groups: list[RolloutGroup] = field(default_factory=list)
    features: list = field(default_factory=list)
    """One ImageFeatures per group (from phase 2: the update pass reuses them, no encoder call)."""
    rewards: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    """This rank's other metrics of the step (the rounds' mean)."""
    means: UnionMeans = field(default_factory=UnionMeans)
    """The reward means (`reward/total`, each component's), weighted by the completions each round scored."""
    dropped_groups: int = 0
    rounds: int = 0

    def take(self, groups: list[RolloutGroup], features: list, rewards: list[float], G: int, picks: list[int]) -> None:
        """Append the picked groups of one round (indices into its lists) with their features and G rewards each."""
        for gi in picks:
            self.groups.append(groups[gi])
            self.features.append(features[gi])
            self.rewards.extend(rewards[gi * G : (gi + 1) * G])

    def settle(self, parts: list, reward_means: set[str]) -> Scored:
        """The rounds' metrics: the reward means weighted by completions, the others' plain mean over rounds."""
        for metrics, n in parts:
            self.means.add({k: metrics.pop(k) for k in list(metrics) if k in reward_means}, n)
        self.metrics = mean_metrics([m for m, _ in parts])
        return self


def sample_rounds(cfg, B: int, sample_round: SampleRound) -> tuple[Scored, list]:
    """Phases 1-4, repeated while dynamic sampling tops the batch up with fresh prompts -> (Scored, the rounds' parts).

    Every round enters `backend.rollout_weights`, a collective gather under ZeRO-3, so the data-parallel ranks
    agree on the round count: rounds go on while any rank still needs prompts (all-reduce MAX). A rank that
    already holds its B informative groups joins such a round but samples nothing: no rollout is generated only
    to be thrown away, and its batch never depends on the other ranks' draws.
    """
    G = cfg.rollout.completions_per_prompt
    out, parts = Scored(), []
    need = B
    while max_over_ranks(need) > 0:
        groups, feats, rewards = sample_round(need, out.rounds, parts)
        out.rounds += 1
        if not cfg.grpo.dynamic_sampling:
            out.groups, out.features, out.rewards = groups, feats, rewards
            break
        informative = [False] * len(groups)
        if groups:  # drop zero-variance groups: their advantages are all 0
            keep, _ = grpo.filter_zero_variance_groups(
                torch.tensor(rewards), torch.arange(len(groups)).repeat_interleave(G)
            )  # [len(groups)*G]
            informative = [bool(keep[gi * G]) for gi in range(len(groups))]
        out.dropped_groups += informative.count(False)
        out.take(groups, feats, rewards, G, [gi for gi, ok in enumerate(informative) if ok])
        need = grpo.prompts_needed(len(out.groups), B, out.rounds - 1, cfg.grpo.max_topup_rounds)
        if need == 0 and len(out.groups) < B:  # rounds exhausted: fill with the last round's dropped groups
            dropped = [gi for gi, ok in enumerate(informative) if not ok]
            out.take(groups, feats, rewards, G, dropped[: B - len(out.groups)])
    return out, parts


def shaped_rewards(state, groups: list[RolloutGroup]) -> tuple[list[float], dict[str, float], set[str]]:
    """Phase 4: the recipe's named components and weighted total per completion, DAPO's overlong shaping added ->
    (totals, metrics, the metric names that are means over completions). Failures are counted zeros, and the first
    five are logged as warnings."""
    cfg = state.cfg
    completions = [c for g in groups for c in g.completions]
    samples = [g.sample for g in groups for _ in g.completions]
    returned = [len(c.images) for c in completions]
    result = score([c.text for c in completions], samples, state.recipe, state.reward_ctx, images_returned=returned)
    totals = list(result.total)
    metrics = result.metrics()
    o = cfg.reward.overlong
    if o.enabled:  # DAPO overlong shaping, added to the total
        lengths = torch.tensor([c.sampled_tokens for c in completions])  # the model's own: no tool response
        penalty = grpo.overlong_penalty(lengths, o.max_length, o.cache_length)
        totals = [t + float(p) for t, p in zip(totals, penalty)]
        metrics["reward/overlong"] = float(penalty.mean())
    metrics["reward/total"] = sum(totals) / len(totals)
    for sid, comp, err in result.failures[:5]:
        state.log_warning(f"reward '{comp}' failed on sample {sid}: {err}")
    return totals, metrics, {"reward/total", "reward/overlong", *(f"reward/{n}" for n in result.components)}
