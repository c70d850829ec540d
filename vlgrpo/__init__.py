"""vlgrpo: the reference GRPO pipeline for Qwen-VL-style vision-language models.

Layers (imports flow one way): config, types -> data, vision_cache, rewards, grpo, memory
-> rollout -> trainer, evals -> cli.
"""

__version__ = "0.1.0"
