"""Where a step's rollout groups come from: phases 1-3 of a GRPO step (batch, vision, rollout) behind one interface,
so the trainer asks for a round's groups the same way whether the engine runs in its process or in a worker.

`Colocated` samples each round now, on the trainer's model (HF) or its own copy (vLLM). `Split` keeps a rollout
worker up to `rollout.max_staleness` steps ahead: the submit-ahead schedule and the staleness of what it returns
live here. Both return each group's features for the update. Knows nothing of rewards or losses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from vlgrpo.types import RolloutGroup

if TYPE_CHECKING:
    from vlgrpo.trainer.state import RunState


@dataclass
class Round:
    """One round's groups, each group's visual features (a list per group) and the source's own metrics."""

    groups: list[RolloutGroup] = field(default_factory=list)
    features: list = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


class RolloutSource(Protocol):
    staleness: int
    """Policy versions between the weights that sampled the last round's groups and the trainer's (0 on-policy)."""

    def sample(self, need: int, round_no: int) -> Round:
        """This step's round `round_no` for `need` prompts (need = 0: the rank only joins the round's collectives)."""
        ...


class Colocated:
    """Samples each round now: 1. the batch, 2. its features (each unique image and video encoded once), 3. G
    completions per prompt."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.staleness = 0

    def sample(self, need: int, round_no: int) -> Round:
        state, timers = self.state, self.state.timers
        samples = state.rows.draw(need) if need else []  # 1. batch
        out = Round()
        # ZeRO-3: gather once for the encoder and HF decoding (vLLM decodes with its own weights: only `visual`)
        with state.backend.rollout_weights(full=not state.engine_needs_weights):
            if samples:
                prompts = [state.rows.prompt(x) for x in samples]  # built once per sample, the engine's too
                with timers("vision"):  # 2. each unique image and video encoded once; the engine and update reuse it
                    out.features = state.cache.get_rows([p.sources for p in prompts])
                with timers("rollout"):  # 3. G completions per prompt, prompt prefilled once per group
                    out.groups = state.engine.generate(samples, state.sampling_for(state.step, round_no), prompts)
        return out


class Split:
    """A rollout worker kept `max_staleness + 1` steps ahead (rollout.placement=split): 1. each step's batch is drawn
    when submitted, 2. a frozen tower's features are encoded then and sent with it, 3. this step's groups are
    collected, their features for the update read back (cache hits, or a trainable tower's encoding). A dynamic-
    sampling top-up round (`round_no` >= 1) draws its `need` prompts now and waits for them: it queues behind the
    steps already submitted, sampled with the seed a colocated run's round uses."""

    def __init__(self, state: RunState, ahead: int) -> None:
        self.state, self.ahead = state, ahead
        self.submitted = state.step
        """The last training step whose prompts went to the worker."""
        self.staleness = 0

    def sample(self, need: int, round_no: int) -> Round:
        state, timers, cfg = self.state, self.state.timers, self.state.cfg
        step = state.step + 1
        todo = []  # (step, round, samples, sampling params)
        while self.submitted < min(state.step + 1 + self.ahead, cfg.train.steps):
            t = self.submitted + 1  # sampled as a colocated run samples step t: same prompts order, same seed
            todo.append((t, 0, state.rows.draw(cfg.train.prompts_per_step), state.sampling_for(t - 1, 0)))
            self.submitted = t
        if round_no and need:
            todo.append((step, round_no, state.rows.draw(need), state.sampling_for(state.step, round_no)))
        self._submit(todo)
        got = None
        if round_no == 0 or need:
            with timers("rollout_wait"):  # the trainer's idle time: the worker had not finished this yet
                got = state.engine.collect(step, round_no)
            # a batch mixes rounds: its staleness is the oldest round's (behaviour log-probs as the ratio's base)
            self.staleness = max(self.staleness if round_no else 0, state.step - got.version)
        # ZeRO-3: the vision gather is a collective; a rank with nothing left to sample joins it all the same
        with state.backend.rollout_weights(full=False), timers("vision"):
            if got is None:
                return Round()
            feats = state.cache.get_rows([state.rows.prompt(g.sample).sources for g in got.groups])  # frozen: encoded
        metrics = {
            **got.stats,
            "rollout/staleness": float(state.step - got.version),
            "rollout/queue_depth": float(state.engine.queue_depth()),
            "timing/rollout_worker_idle": got.worker_idle_s,
            "timing/rollout_worker_receive": got.worker_receive_s,
        }
        return Round(got.groups, feats, metrics)

    def _submit(self, todo: list) -> None:
        """Send requests to the worker. A frozen tower's features are encoded here, while the worker samples the
        batch before, and go with the request, so the worker only decodes (each image encoded once in all); a
        trainable tower's worker encodes with the version it holds. Under ZeRO-3 the vision gather is a collective:
        every rank enters it once per round, with or without requests of its own."""
        state = self.state
        if state.cache.trainable:
            for step, round_no, samples, params in todo:
                state.engine.submit(step, samples, params, round_no, prompts=[state.rows.prompt(x) for x in samples])
            return
        with state.backend.rollout_weights(full=False), state.timers("vision"):
            for step, round_no, samples, params in todo:
                prompts = [state.rows.prompt(x) for x in samples]  # the worker's engine samples from these
                sources = [src for p in prompts for src in p.sources]
                state.cache.get(sources)
                state.engine.submit(step, samples, params, round_no, state.cache.handover(sources), prompts)


def rollout_source(state: RunState, ahead: int) -> RolloutSource:
    """The source a run's placement asks for: Split with a worker process (rollout.placement=split), else Colocated."""
    return Split(state, ahead) if state.split else Colocated(state)
