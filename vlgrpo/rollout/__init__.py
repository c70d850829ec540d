"""Rollout engines: `base` (protocol + SamplingParams), `build` (the one builder of every engine), `hf`
(transformers, prefill once per group; `decode`: its shared-prefix decode step), `vllm/` (the vLLM engine: `engine`,
the only module that imports vllm, lazily; `inputs`: its requests), `tools/` and `turns` (multi-turn rollouts with
tools). Prompts and the feature-injected forward passes are `vlgrpo.policy`'s."""

from vlgrpo.rollout.base import RolloutEngine, SamplingParams

__all__ = ["RolloutEngine", "SamplingParams"]
