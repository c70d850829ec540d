"""Rollout engines: `base` (protocol + SamplingParams), `hf` (transformers, prefill once per group; `decode`: its
shared-prefix decode step) and `vllm` (the only module that imports vllm, lazily; `vllm_inputs`: its requests).
Prompts and the feature-injected forward passes are `vlgrpo.policy`'s."""

from vlgrpo.rollout.base import RolloutEngine, SamplingParams

__all__ = ["RolloutEngine", "SamplingParams"]
