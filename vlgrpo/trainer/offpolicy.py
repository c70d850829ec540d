"""Phase 6 of a GRPO step: the log-probs the policy ratio is taken against and the rollout IS weights.

Four cases, chosen per step:
- on-policy, the trainer samples with its own weights (HF engine, num_iterations = 1): nothing to compute;
- the engine sampled with its own copy of the weights (vLLM): one forward pass measures the engine/trainer log-prob
  gap and gives the rollout IS weights (`grpo.rollout_is`);
- num_iterations > 1: the same pass gives the old log-probs of the clipped surrogate;
- a split rollout's stale group (sampled by an older policy version): the behaviour log-probs the worker reported
  are the ratio's base (no extra pass), or with `grpo.decoupled` (AReaL) the current policy is the proximal one and
  the behaviour log-probs give capped IS weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from vlgrpo import grpo
from vlgrpo.models import eval_mode
from vlgrpo.policy.forward import completion_logits, scored_ids
from vlgrpo.trainer.batch import TrainBatch
from vlgrpo.trainer.metrics import UnionMeans


@dataclass
class Correction:
    """What the update needs from phase 6."""

    old_logp: torch.Tensor | None = None
    """[R, C] the ratio's base; None: the update's own (detached) pass, ratio exactly 1."""
    is_weights: torch.Tensor | None = None
    """[R, C] rollout IS weights; None: unweighted."""
    metrics: UnionMeans = field(default_factory=UnionMeans)
    """The engine/trainer gap and the IS weights' stats, with the tokens (or sequences) each averages over."""


class OffPolicy:
    """Picks the case for a step and computes it. `micro_batches(batch)` yields (rows, part, features) as the
    update's pass sees them."""

    def __init__(self, state, micro_batches: Callable[[TrainBatch], Iterator]) -> None:
        self.state, self.micro_batches = state, micro_batches
        g = state.cfg.grpo
        self.rollout_is = grpo.resolve_rollout_is(g.rollout_is, state.engine_logprobs_differ)
        if state.split and g.decoupled:  # AReaL's capped behaviour weight: per token, truncated
            self.rollout_is = "token_truncate" if g.rollout_is == "auto" else g.rollout_is

    def __call__(self, batch: TrainBatch, staleness: int) -> Correction:
        state, g, timers = self.state, self.state.cfg.grpo, self.state.timers
        stale = state.split and staleness > 0 and batch.engine_logp is not None  # split rollout, older version
        if stale and g.decoupled:  # the current policy is the proximal one (ratio 1 in the single update)
            with timers("old_logprob"):
                _, proximal = self.old_logprobs(batch)
            return Correction(None, *self.rollout_correction(batch, proximal))
        if stale:  # the behaviour policy's log-probs are the ratio's base: the clipped surrogate corrects for the
            return Correction(batch.engine_logp.nan_to_num(0.0))  # versions behind (no extra pass); NaN: padding
        differ = state.engine_logprobs_differ  # vLLM: its gap to the trainer is measured and corrected
        if g.num_iterations == 1 and not differ:
            return Correction()
        with timers("old_logprob"):
            old_logp, behaviour_logp = self.old_logprobs(batch)
        is_weights, metrics = self.rollout_correction(batch, behaviour_logp) if differ else (None, UnionMeans())
        # on-policy (num_iterations = 1): ratio exactly 1, the trainer's own pass, not its re-run, is the base
        return Correction(old_logp if g.num_iterations > 1 else None, is_weights, metrics)

    @torch.no_grad()
    def old_logprobs(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(old log-probs [R, C] over the full vocabulary, for the policy ratio; the same tokens under the engine's
        sampling distribution — top-k / top-p replayed, as vLLM reports them — for the engine comparison), one
        forward per micro-batch."""
        state, r = self.state, self.state.cfg.rollout
        full, behaviour = [], []
        with eval_mode(state.backend.model):
            for _, part, feats in self.micro_batches(batch):
                logits = completion_logits(state.backend.model, part, feats)  # [r, C, V]
                ids = scored_ids(part)  # tool-response tokens as the update pass reads them
                full.append(
                    grpo.token_logprobs(logits, ids, temperature=state.temperature, forbidden=state.forbidden)[0]
                )
                behaviour.append(
                    grpo.truncated_token_logprobs(
                        logits,
                        ids,
                        temperature=state.temperature,
                        forbidden=state.forbidden,
                        top_k=r.top_k,
                        top_p=r.top_p,
                    )
                )
        return torch.cat(full), torch.cat(behaviour)

    def rollout_correction(self, batch: TrainBatch, behaviour_logp: torch.Tensor):
        """The engine/trainer log-prob gap of this step's samples (`rollout/logprob_abs_diff*`) and the rollout IS
        weights [R, C] (None with grpo.rollout_is=none) with their stats (`grpo/is_*`)."""
        g = self.state.cfg.grpo
        metrics = UnionMeans()
        if batch.engine_logp is None:
            return None, metrics
        mean, worst = grpo.logprob_gap(behaviour_logp, batch.engine_logp, batch.loss_mask)
        compared = batch.loss_mask.bool() & ~torch.isnan(batch.engine_logp)  # the tokens `logprob_gap` compares
        metrics.add({"rollout/logprob_abs_diff": mean}, float(compared.sum()))
        metrics.add_max({"rollout/logprob_abs_diff_max": worst})
        if self.rollout_is == "none":
            return None, metrics
        weights, stats = grpo.rollout_is_weights(
            behaviour_logp, batch.engine_logp, batch.loss_mask, self.rollout_is, g.rollout_is_cap, g.rollout_is_sequence
        )
        mask = batch.loss_mask.bool()  # the IS stats' items: tokens, or the sequences with a token
        items = float(mask.any(-1).sum()) if self.rollout_is.startswith("sequence") else float(mask.sum())
        metrics.add({f"grpo/{k}": float(stats[k]) for k in ("is_mean", "is_clipped_frac")}, items)
        metrics.add_max({"grpo/is_max": float(stats["is_max"])})
        return weights, metrics
