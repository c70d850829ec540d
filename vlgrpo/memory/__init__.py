"""★ Per-GPU memory planner for GRPO runs on Qwen-VL models (pure arithmetic; no torch needed to plan).

`specs` counts parameters of a model, `inputs` holds a plan's input (`PlanInput`), `tokens` counts a prompt's text,
images and video, `terms` has one byte formula per memory consumer, `planner` adds them into per-GPU phase peaks, `fit`
judges them per GPU type, `suggest` lists config changes that make a run fit (only what the trainer runs).
`from_config` maps a run config onto a `PlanInput` (`deepspeed_json`: a zero3 run's DeepSpeed file, `tiny_spec`: the
unbuilt default model), `flags` parses `vlgrpo plan`'s flag values and `report` builds and renders its output.
Formulas: docs/memory.md.
"""

from vlgrpo.memory.fit import GB, GPU_TYPES, verdicts
from vlgrpo.memory.from_config import plan_input_from_config
from vlgrpo.memory.inputs import PlanInput
from vlgrpo.memory.models import MODEL_TABLE, resolve_model
from vlgrpo.memory.planner import plan
from vlgrpo.memory.report import build_report, format_report
from vlgrpo.memory.specs import ModelSpec, PlanError, kv_cache_bytes, lora_params
from vlgrpo.memory.suggest import suggestions
from vlgrpo.memory.terms import bytes_per_param

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
