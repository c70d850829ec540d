"""The handover of the rollout's prompt prefill to the update (`policy.kept_prefill`), in a run where
`config.prefill.prefill_once` says it applies. The engine keeps nothing for a mixture-of-experts model (its prompts'
experts are recorded, and routed by the update's own pass) or prompts decoded in several chunks, and the update checks
the kept prompts are its batch's (`KeptPrefill.serves`: a dynamic-sampling batch mixes rounds), so any other step
runs its own prompt pass. `state` is the run's `trainer.state.RunState` (which calls `enable` when it is built, so
this module does not import it), `batch` a `trainer.batch.TrainBatch`.
"""

from __future__ import annotations

from vlgrpo.config.prefill import prefill_once as config_prefill_once
from vlgrpo.policy.kept_prefill import Leaves
from vlgrpo.rollout.hf import HFEngine


def prefill_once(state) -> bool:
    """Whether this run's update can take the rollout's prefill: the config's decision (`config.prefill`) for the
    device it trains on, with the engine the trainer's own HF engine and the tower frozen as built."""
    applies, _ = config_prefill_once(state.cfg, state.device.type)
    return applies and type(state.engine) is HFEngine and not state.backend.vision_trainable()


def enable(state) -> None:
    """Ask the engine to keep its prefill when the run's update can take it."""
    if prefill_once(state):
        state.engine.keep_prefill = True


def take(state, batch) -> Leaves | None:
    """This step's kept prefill as leaves for the update, when it is this batch's prompts; None: the update prefills
    (the engine lets go of its graph either way)."""
    engine = state.engine
    kept = engine.take_prefill() if type(engine) is HFEngine else None
    if kept is None or not kept.serves(batch.batch.prompt_ids):
        return None
    return kept.leaves(state.backend.model)
