"""★ Per-GPU memory planner for GRPO runs on Qwen-VL models (pure arithmetic; no torch needed to plan).

`specs` counts parameters of a model, `planner` turns a `PlanInput` into per-GPU bytes and verdicts, `suggest`
lists config changes that make it fit (only what the trainer runs), `tokens` counts a prompt's text, images and video,
`report` maps a run config onto a `PlanInput` and renders `vlgrpo plan`. Formulas: docs/memory.md.
"""

from vlgrpo.memory.planner import GB, GPU_TYPES, PlanInput, bytes_per_param, plan, verdicts
from vlgrpo.memory.report import build_report, format_report, plan_input_from_config
from vlgrpo.memory.specs import MODEL_TABLE, ModelSpec, PlanError, kv_cache_bytes, lora_params, resolve_model
from vlgrpo.memory.suggest import suggestions

__all__ = [
    "GB",
    "GPU_TYPES",
    "MODEL_TABLE",
    "ModelSpec",
    "PlanError",
    "PlanInput",
    "build_report",
    "bytes_per_param",
    "format_report",
    "kv_cache_bytes",
    "lora_params",
    "plan",
    "plan_input_from_config",
    "resolve_model",
    "suggestions",
    "verdicts",
]
