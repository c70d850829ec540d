"""The training loop: one GRPO (or SFT) step that reads top to bottom as the numbered phases of docs/design.md.

Recipes glue, components compute: every phase calls a library function (vision cache, rollout engine, rewards,
grpo math, backend) inside a `timing/<phase>` timer. Variants (advantage, ratio, aggregation) are picked once.
"""

from __future__ import annotations

import time

import torch

from vlgrpo import grpo
from vlgrpo.models import eval_mode
from vlgrpo.policy.forward import completion_logprobs_and_entropy
from vlgrpo.registry import ADVANTAGE, AGGREGATION, RATIO
from vlgrpo.rollout.base import staleness
from vlgrpo.trainer import prefill_once
from vlgrpo.trainer.backends import no_dropout
from vlgrpo.trainer.batch import TrainBatch, attach_crops, make_batch, over_turn_mask
from vlgrpo.trainer.checkpoint import checkpoint_dirs
from vlgrpo.trainer.metrics import UnionMeans, add_routing_metrics, memory_metrics
from vlgrpo.trainer.offpolicy import OffPolicy
from vlgrpo.trainer.ranks import gather_from_ranks, global_normalisers, sum_tensor_over_ranks
from vlgrpo.trainer.scoring import Scored, sample_rounds, shaped_rewards
from vlgrpo.trainer.sft import gold_group
from vlgrpo.trainer.source import rollout_source
from vlgrpo.trainer.state import RunState
from vlgrpo.trainer.trajectory_log import log_trajectories
from vlgrpo.trainer.watchdog import Watchdog
from vlgrpo.types import InputError, RolloutGroup
from vlgrpo.vision_cache import VisionCache


class NonFiniteError(InputError):
    """The loss or gradient stayed non-finite for train.max_nonfinite_steps steps in a row: the run stopped."""


class Trainer:
    """Runs steps over a RunState (model, backend, engine, cache, data) built by `trainer.state.build_state`."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        g = state.cfg.grpo
        self.advantage_fn = ADVANTAGE.load(g.advantage)
        self.ratio_fn = RATIO.load(g.ratio)
        self.aggregate_fn = AGGREGATION.load(g.aggregation)
        self.step_fn = self.sft_step if state.cfg.train.stage == "sft" else self.grpo_step
        self.off_policy = OffPolicy(state, self.micro_batches)
        self._reward_means: set[str] = {"reward/total"}
        """The reward metrics that are means over completions (the total, each component's; set by `_rewards`)."""
        self.source = rollout_source(state, staleness(state.cfg))
        """Where each round's groups come from (trainer/source.py): sampled now, or by a worker kept ahead."""
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.watchdog = Watchdog(state.cfg.train.fault_timeout_s, rank, state.step)
        state.timers.on_phase = self.watchdog.beat

    # ------------------------------------------------------------------ GRPO
    def grpo_step(self) -> dict[str, float]:
        state, cfg, timers = self.state, self.state.cfg, self.state.timers
        B, G = cfg.train.prompts_per_step, cfg.rollout.completions_per_prompt
        # 1-4. batch -> vision -> rollout -> reward, repeated while dynamic sampling tops the batch up
        scored = self._sample_and_score(B)
        groups, features = scored.groups[:B], scored.features[:B]
        log_trajectories(state, groups, scored.rewards[: B * G])  # rollout.tools: a few, every N steps
        rewards = torch.tensor(scored.rewards[: B * G])  # [B*G]
        group_ids = torch.arange(len(groups)).repeat_interleave(G)  # [B*G]

        # 5. advantage: per group (r - mean) / (std + eps) or its variants
        with timers("advantage"):
            advantages, adv_stats = self.advantages(rewards, group_ids)  # [B*G]
            if cfg.rollout.over_turn_masking:  # Mini-o3: a trajectory cut at max_turns is neither good nor bad
                advantages = advantages.masked_fill(over_turn_mask(groups), 0.0)
            advantages = advantages.to(state.device)
            batch = self._collate(groups, features)

        # 6. the ratio's base and the rollout IS weights (trainer/offpolicy.py): nothing when on-policy
        correction = self.off_policy(batch, self.source.staleness)
        ref_logp = None
        if cfg.grpo.beta > 0:
            with timers("ref_logprob"), state.backend.reference() as ref_model:
                ref_logp = self._logprobs(ref_model, batch, self._reference_features(ref_model, batch))

        # 7. update: num_iterations passes over micro-batches; token-mean normalises by the whole batch
        with timers("update"):
            opt_stats, means = self._update(batch, advantages, correction.old_logp, ref_logp, correction.is_weights)

        # 8. sync the rollout engine (a version bump for the HF engine sharing the model)
        state.step += 1
        with timers("sync"):  # nothing, the LoRA adapter alone, or the full weights (RunState.sync_engine)
            state.cache.set_step(state.step)  # a trainable tower's cached features are now stale
            synced = state.sync_engine()
        lengths = batch.loss_mask.sum(1)  # [R]: the tokens the model sampled (not a tool-response turn's)
        means.add({"grpo/response_length": float(lengths.float().mean())}, len(lengths))
        means.add({f"grpo/{k}": v for k, v in adv_stats.items()}, len(rewards))  # shares of the completions
        for part in (scored.means, correction.metrics):
            means.merge(part)
        return {
            **scored.metrics,
            **opt_stats,
            **means.reduce(gather_from_ranks),  # the union batch's, over every rank
            "grpo/dropped_groups": float(scored.dropped_groups),
            "grpo/sampling_rounds": float(scored.rounds),
            "rollout/placeholder_masked": float(batch.masked_rows),
            **synced.metrics(),
        }

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Phase 5 on this rank's rewards [B*G]: a group's statistics are its own (a group never spans ranks); a
        batch-wide one (`grpo.advantage=batch`'s std) is the union batch's, reduced over every rank."""
        return self.advantage_fn(rewards, group_ids, eps=self.state.cfg.grpo.std_eps, sum_ranks=sum_tensor_over_ranks)

    def _sample_and_score(self, B: int) -> Scored:
        """Phases 1-4 (`trainer/scoring.py`: rounds while dynamic sampling tops the batch up)."""
        scored, parts = sample_rounds(self.state.cfg, B, self._sample_round)
        return scored.settle(parts, self._reward_means)

    def _sample_round(self, need: int, round_no: int, parts: list) -> tuple[list[RolloutGroup], list, list[float]]:
        """One round for `need` prompts -> (groups, features, rewards [need*G]): phases 1-3 from the rollout source
        (colocated or split), 4. their rewards; the round's metrics go to `parts`. need = 0: the rank only joins the
        round's collectives (the weight gather under ZeRO-3) and returns empty lists."""
        got = self.source.sample(need, round_no)
        if not got.groups:
            return [], [], []
        with self.state.timers("reward"):  # 4. named components + weighted total; failures are counted zeros
            rewards, metrics = self._rewards(got.groups)
        parts.append(({**metrics, **got.metrics}, len(rewards)))
        return got.groups, got.features, rewards

    def _rewards(self, groups: list[RolloutGroup]) -> tuple[list[float], dict[str, float]]:
        totals, metrics, self._reward_means = shaped_rewards(self.state, groups)
        return totals, metrics

    def _collate(self, groups: list[RolloutGroup], features: list) -> TrainBatch:
        state = self.state
        sources = [state.rows.prompt(g.sample).sources for g in groups]
        batch = make_batch(
            groups,
            features,
            state.pad_id,
            state.image_token_id,
            state.forbidden_ids,
            state.device,
            video_token_id=state.video_token_id,
            sources=sources,
            routing_replay=state.cfg.train.routing_replay == "rollout",
            router_aux_loss_coef=state.cfg.train.router_aux_loss_coef,
        )
        attach_crops(batch, groups, state.cache)  # multi-turn rollouts: the tools' crops, from the vision cache
        return batch

    def micro_batches(self, batch: TrainBatch, features: list | None = None):
        """(rows, CompletionBatch, features of its prompts). With a trainable vision tower and grad enabled the
        features are re-encoded with autograd (the cached ones are detached); otherwise cached features are used."""
        state = self.state
        for rows, part, used in batch.micro_batches(state.cfg.train.micro_batch_completions):
            if features is None and torch.is_grad_enabled() and state.backend.vision_trainable():
                sources = [batch.sources[i] for i in used]
                if state.backend.name == "zero3" and not any(sources):
                    raise InputError(
                        "train.backend=zero3 with a trainable vision tower: a micro-batch of rows without an image "
                        f"or a video (prompts {used} of this rank's batch) makes no tower call "
                        "where the other ranks' micro-batches make one (each call gathers the tower's shards), so "
                        "the ranks' collectives would not pair up; freeze the tower (model.freeze_vision=true) or "
                        "keep text-only rows out of the training data"
                    )
                feats = state.cache.encode_rows_with_grad(sources)  # images and videos in one tower call
            else:
                feats = [(features or batch.features)[i] for i in used]
            yield rows, part, feats

    def _reference_features(self, ref_model, batch: TrainBatch) -> list | None:
        """The reference policy's own image features when the policy's tower trains (frozen: they are shared). Under
        ZeRO-3 its tower is gathered for this (`reference_vision`): each rank encodes what its own cache misses."""
        state = self.state
        if ref_model is None or not state.backend.vision_trainable():
            return None
        with state.backend.reference_vision() as fingerprint:
            if state.ref_cache is None:  # the reference never changes: its features stay valid for the whole run
                state.ref_cache = VisionCache(
                    ref_model, state.lm.processor, state.cfg.rollout.vision_cache_bytes, fingerprint=fingerprint
                )
            return state.ref_cache.get_rows(batch.sources)

    @torch.no_grad()
    def _logprobs(self, model, batch: TrainBatch, features: list | None = None) -> torch.Tensor:
        out, state = [], self.state
        with eval_mode(model):
            for _, part, feats in self.micro_batches(batch, features):
                out.append(completion_logprobs_and_entropy(model, part, feats, state.forbidden, state.temperature)[0])
        return torch.cat(out)  # [R, C]

    def _update(self, batch: TrainBatch, advantages, old_logp, ref_logp, is_weights=None) -> dict[str, float]:
        state, g = self.state, self.state.cfg.grpo
        # the union batch's counts over every rank and micro-batch (/ world size: the ranks' gradients are averaged),
        # so the micro-batch losses of all ranks add up to the loss of one process on the whole batch
        num_tokens, num_sequences = global_normalisers(batch.loss_mask)
        means, opt_stats, losses = UnionMeans(), {}, []
        model = state.backend.model
        routing = batch.batch.routing
        if routing is not None:  # what the update's own passes route (the reference's and old passes' set aside)
            routing.observed.clear()
            routing.aux_terms.clear()
        passes = -(-batch.rows // state.cfg.train.micro_batch_completions)  # micro-batches per pass over the batch
        prompts = prefill_once.take(state, batch)  # the rollout's prompt prefill, when it is this update's
        with no_dropout(model):  # train mode so checkpointing engages; p = 0 so the on-policy ratio is exactly 1
            for _ in range(g.num_iterations):
                for rows, part, feats in self.micro_batches(batch):
                    used = batch.batch.used_prompts(range(rows.start, rows.stop))
                    logp, entropy = completion_logprobs_and_entropy(
                        model,
                        part,
                        feats,
                        state.forbidden,
                        state.temperature,
                        None if prompts is None else prompts.part(used),
                    )
                    loss, stats = grpo.policy_loss(
                        logp,
                        None if old_logp is None else old_logp[rows],
                        advantages[rows],
                        batch.loss_mask[rows],
                        log_ratio=self.ratio_fn,
                        aggregate=self.aggregate_fn,
                        clip_low=g.clip_low,
                        clip_high=g.clip_high,
                        dual_clip=g.dual_clip,
                        beta=g.beta,
                        ref_logp=None if ref_logp is None else ref_logp[rows],
                        entropy=entropy.detach(),
                        num_tokens=num_tokens,
                        num_sequences=num_sequences,
                        max_completion_length=state.cfg.rollout.max_new_tokens,
                        is_weights=None if is_weights is None else is_weights[rows],
                    )
                    aux = part.routing.aux_loss() if part.routing is not None else None
                    if aux is not None:  # the routers' load balance, its share of the batch's
                        loss = loss + state.cfg.train.router_aux_loss_coef * aux / passes
                        means.add({"moe/aux_loss": float(aux.detach())}, 1.0)
                    state.backend.backward(loss)
                    losses.append(loss.item())
                    weights = grpo.stat_weights(self.ratio_fn, batch.loss_mask[rows])
                    means.add(
                        {f"grpo/{k}": float(v) for k, v in stats.items()}, {f"grpo/{k}": weights[k] for k in stats}
                    )
                carried = prompts.carry() if prompts is not None else None
                if carried is not None:  # the micro-batches' gradients at the prompts, through the rollout's prefill
                    state.backend.backward(carried)
                opt_stats = state.backend.step()
        # each rank's loss is its share of the union's (sum over its tokens / the union's tokens per rank): the
        # union's loss is the ranks' mean
        means.add({"train/loss": sum(losses) / g.num_iterations}, 1.0)
        add_routing_metrics(means, routing, model)
        return opt_stats, means

    # ------------------------------------------------------------------ SFT
    def sft_step(self) -> dict[str, float]:
        state, cfg, timers = self.state, self.state.cfg, self.state.timers
        samples = state.rows.draw(cfg.train.prompts_per_step)  # 1. batch
        with timers("vision"), state.backend.rollout_weights(full=False):  # 2. features from the cache
            feats = state.cache.get_rows([state.rows.prompt(x).sources for x in samples])
        with timers("update"):  # teacher-forced NLL of the gold answer in the target format
            batch = self._collate([gold_group(state, x) for x in samples], feats)
            (num_tokens, _), total = global_normalisers(batch.loss_mask), 0.0  # the union batch's tokens, as GRPO
            with no_dropout(state.backend.model):  # train mode: gradient checkpointing engages
                for rows, part, feats in self.micro_batches(batch):
                    logp, _ = completion_logprobs_and_entropy(state.backend.model, part, feats, state.forbidden, 1.0)
                    loss = -(logp * batch.loss_mask[rows]).sum() / max(num_tokens, 1e-8)
                    state.backend.backward(loss)
                    total += loss.item()
                opt_stats = state.backend.step()
        state.step += 1
        state.cache.set_step(state.step)
        return {"train/loss": total, **opt_stats}

    # ------------------------------------------------------------------ driving
    def _counters(self) -> dict[str, float]:
        """This step's vision-cache and engine counters (then reset), plus the cache hit rate."""
        state = self.state
        vision = state.cache.stats()
        out = {f"vision/{k}": float(v) for k, v in vision.items()}
        lookups = vision.get("hits", 0) + vision.get("misses", 0)
        out["vision/hit_rate"] = vision.get("hits", 0) / lookups if lookups else 0.0
        state.cache.reset_stats()
        if state.engine is not None:
            out.update({k: float(v) for k, v in state.engine.stats().items()})  # already `rollout/*`
            state.engine.reset_stats()
        return out

    def train(self) -> list[dict]:
        """Run until train.steps; checkpoint, evaluate and log on schedule. Returns the logged rows.

        A step's checkpoint is written before its in-loop eval: a failing eval (`_evaluate`) never costs the weights.
        A step whose loss or gradient is non-finite leaves the weights alone (the backend skips its optimiser step,
        on every rank alike) and is counted in `train/nonfinite_steps`; after train.max_nonfinite_steps such steps in
        a row the run logs the step and stops with NonFiniteError, without writing a checkpoint of its own."""
        state, cfg = self.state, self.state.cfg
        history = []
        self.watchdog.start()
        try:
            while state.step < cfg.train.steps:
                history.append(self._one_step())
        finally:
            self.watchdog.stop()
        if not history:
            state.save_checkpoint()  # for a loop that ran no step (an existing checkpoint is not written again)
        return history

    def _one_step(self) -> dict:
        """One step with its checkpoint, in-loop eval and metrics row (see `train`)."""
        state, cfg = self.state, self.state.cfg
        self.watchdog.beat("batch", state.step + 1)
        t0 = time.perf_counter()
        skipped_before, scaled_before = state.backend.skipped_steps, getattr(state.backend, "loss_scale_skips", 0)
        metrics = self.step_fn()
        nonfinite = state.backend.skipped_steps > skipped_before
        scaled = getattr(state.backend, "loss_scale_skips", 0) > scaled_before  # fp16: the loss scaler's overflow
        # both leave the weights alone and count as non-finite steps; only a non-finite loss or gradient is a streak
        # (the loss scaler skips a few steps in a row by design while it finds its scale)
        state.nonfinite_steps += nonfinite or scaled
        state.nonfinite_streak = state.nonfinite_streak + 1 if nonfinite else 0
        metrics["train/nonfinite_steps"] = float(state.nonfinite_steps)
        metrics.update(state.rows.counts())  # every rank's, summed (a collective: every rank logs or not alike)
        stop = state.nonfinite_streak >= cfg.train.max_nonfinite_steps
        self.watchdog.beat("save")
        save_s = self._save_if_due() if not stop else 0.0
        if state.evaluator is not None and cfg.eval.every_steps and state.step % cfg.eval.every_steps == 0:
            metrics.update(self._evaluate())
        self.watchdog.beat("log")
        metrics.update(state.timers.pop())
        metrics.update(self._counters())
        metrics.update(memory_metrics())
        metrics["timing/step"] = time.perf_counter() - t0 - save_s  # the step and its eval, not the write
        if stop or state.step % cfg.logging.log_every == 0 or state.step == cfg.train.steps:
            state.logger.log(state.step, metrics)
        if stop:
            raise self._nonfinite_error()
        return {"step": state.step, **metrics}

    def _save_if_due(self) -> float:
        """Write this step's checkpoint on train.save_every and at the last step; the seconds it took."""
        state, t, t0 = self.state, self.state.cfg.train, time.perf_counter()
        if (t.save_every and state.step % t.save_every == 0) or state.step == t.steps:
            state.save_checkpoint()
        return time.perf_counter() - t0

    def _evaluate(self) -> dict[str, float]:
        """This step's in-loop eval metrics and `eval/failures`: an eval that raises is a warning, not the run's end
        (the step's checkpoint is written already; KeyboardInterrupt and SystemExit still stop the run). The error
        leaves `rollout_weights` through its exit, a collective under ZeRO-3 (DeepSpeed all-reduces on leaving its
        gather), so a rank whose eval fails alone waits there for the others; nothing inside the eval is a
        collective. The count stays per rank: the metrics row is rank 0's."""
        state, metrics = self.state, {}
        try:
            with state.timers("eval"), state.backend.rollout_weights():
                metrics = state.evaluator(state)
        except Exception as e:  # noqa: BLE001 - a measurement, not the job
            state.eval_failures += 1
            state.log_warning(
                f"in-loop eval at step {state.step} failed, training goes on (eval/failures = "
                f"{state.eval_failures}): {type(e).__name__}: {e}"
            )
        return {**metrics, "eval/failures": float(state.eval_failures)}

    def _nonfinite_error(self) -> NonFiniteError:
        state, limit = self.state, self.state.cfg.train.max_nonfinite_steps
        kept = [p.name for p in checkpoint_dirs(state.run_dir)]
        return NonFiniteError(
            f"stopped at step {state.step}: the loss or gradient was NaN or infinite in {state.nonfinite_streak} steps "
            f"in a row (train.max_nonfinite_steps={limit}). Their optimiser steps were skipped, so the weights are "
            f"those after step {state.step - state.nonfinite_streak}; kept checkpoints: {', '.join(kept) or 'none'}. "
            "Look at train/loss, train/grad_norm and reward/* in metrics.jsonl: a reward returning huge or infinite "
            "values, or a train.lr that is too high, are the usual causes"
        )
