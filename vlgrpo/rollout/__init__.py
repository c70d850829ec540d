"""Rollout engines: `base` (protocol + SamplingParams), `inputs` (prompts and feature-injected passes), `hf`
(transformers, prefill once per group) and `vllm` (the only module that imports vllm, lazily)."""

from vlgrpo.rollout.base import RolloutEngine, SamplingParams

__all__ = ["RolloutEngine", "SamplingParams"]
