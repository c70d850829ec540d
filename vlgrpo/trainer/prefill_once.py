"""Whether a run's update reads the rollout's prompt prefill (`policy.kept_prefill`), and the handover each step.

The one place that decides it. It holds when the update's weights are the ones the rollout prefilled with and its
prompt pass would be the same computation: the colocated HF engine shares the trainer's module
(`rollout.hf.HFEngine`), one update pass per batch (num_iterations 1: the weights move only after it), the whole
module in this process (plain or lora: ZeRO-3 gathers the weights only around the rollout), no gradient
checkpointing (the update then runs whole rows) and a frozen tower (a trainable one is re-encoded with autograd for
the update). The engine itself keeps nothing for a multi-turn rollout, a mixture-of-experts model (its prompts'
experts are recorded, and routed by the update's own pass) or prompts decoded in several chunks, and the update
checks the kept prompts are its batch's (`KeptPrefill.serves`: a dynamic-sampling batch mixes rounds), so any other
step runs its own prompt pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlgrpo.policy.kept_prefill import Leaves
from vlgrpo.rollout.hf import HFEngine

if TYPE_CHECKING:
    from vlgrpo.trainer.batch import TrainBatch
    from vlgrpo.trainer.state import RunState


def prefill_once(state: RunState) -> bool:
    """Whether this run's update can take the rollout's prefill (the conditions above; `train.prefill_once`)."""
    cfg = state.cfg
    return (
        cfg.train.prefill_once
        and cfg.train.stage == "grpo"
        and type(state.engine) is HFEngine
        and cfg.grpo.num_iterations == 1
        and state.backend.name in ("plain", "lora")
        and not cfg.model.gradient_checkpointing
        and not state.backend.vision_trainable()
    )


def enable(state: RunState) -> None:
    """Ask the engine to keep its prefill when the run's update can take it."""
    if prefill_once(state):
        state.engine.keep_prefill = True


def take(state: RunState, batch: TrainBatch) -> Leaves | None:
    """This step's kept prefill as leaves for the update, when it is this batch's prompts; None: the update prefills
    (the engine lets go of its graph either way)."""
    engine = state.engine
    kept = engine.take_prefill() if type(engine) is HFEngine else None
    if kept is None or not kept.serves(batch.batch.prompt_ids):
        return None
    return kept.leaves(state.backend.model)
