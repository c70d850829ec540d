"""Rewards: verifiable answers, format, model-aware grounding, and their weighted composition.

The trainer calls `score(completions, samples, recipe, ctx)` with `ctx = context_from_config(cfg, arch)`; each
completion is parsed once (`Parsed`) for all components. No model code and no torch here (transformers is imported
lazily, only to convert Qwen2.5-VL resized-pixel boxes; math_verify and sympy only for math answers).
"""

from vlgrpo.rewards.boxes import BOX_FORMATS, box_format_for_arch, parse_boxes, to_original_pixels
from vlgrpo.rewards.compose import DEFAULT_RECIPES, RewardBatch, check_recipe, default_recipe, score
from vlgrpo.rewards.context import RewardContext, context_from_config
from vlgrpo.rewards.extract import answer_block, extract_answer
from vlgrpo.rewards.format import format_ok
from vlgrpo.rewards.parsed import Parsed
from vlgrpo.rewards.registry import REWARDS, RewardError, predicted_boxes, resolve_reward, sample_fields

__all__ = [
    "BOX_FORMATS",
    "DEFAULT_RECIPES",
    "Parsed",
    "REWARDS",
    "RewardBatch",
    "RewardContext",
    "RewardError",
    "answer_block",
    "box_format_for_arch",
    "check_recipe",
    "context_from_config",
    "default_recipe",
    "extract_answer",
    "format_ok",
    "parse_boxes",
    "predicted_boxes",
    "resolve_reward",
    "sample_fields",
    "score",
    "to_original_pixels",
]
