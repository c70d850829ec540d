"""The one builder of rollout engines: the trainer's, the split worker's, the in-loop eval's, `vlgrpo eval`'s and the
demo's engine all come from `build_engine`, each from one `PromptSettings` value, so a prompt setting added later
reaches every engine by construction. Knows the engines only through the registry (`vlgrpo.registry.ENGINE`) and
their two constructors (`from_config` for a run, `for_eval` for greedy decoding).
"""

from __future__ import annotations

from typing import Any

from vlgrpo.policy.prompt import PromptSettings
from vlgrpo.registry import ENGINE


def build_engine(
    kind: str,
    lm,
    cache,
    prompt: PromptSettings,
    *,
    run=None,
    model=None,
    batch_prompts: int = 8,
    **launch: Any,
):
    """A rollout engine of `kind` (hf, vllm) over the LoadedModel `lm` and its vision cache, writing prompts as
    `prompt` says, wrapped in the multi-turn rollout when `prompt.tools` names any.

    run: a training run's Config: the engine it samples with (rollout.*, LoRA sync, placement; the step's prompts as
    one batch). Else a greedy decoder for evaluation: `model` (default lm.model: the in-loop eval passes the training
    module) decoded `batch_prompts` at a time; `launch` (dtype, engine_kwargs, gpu_memory_utilization) reaches an
    engine that loads its own copy (vLLM)."""
    engine_class = ENGINE.load(kind)  # vllm is imported only when chosen
    if run is not None:
        engine = engine_class.from_config(run, lm, cache, prompt)
    else:
        engine = engine_class.for_eval(lm, cache, prompt, model=model, batch_prompts=batch_prompts, **launch)
    if prompt.tools:  # multi-turn: each tool call answered in a turn of its own (rollout/turns.py)
        from vlgrpo.rollout.turns import ToolRollout

        engine = ToolRollout(engine, prompt.tools, prompt.max_turns, prompt.max_total_length)
    return engine
