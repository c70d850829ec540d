"""`vlgrpo plan` glue: map a run config onto a `PlanInput`, assemble the JSON report, render the table.

The only memory module that knows the config tree; the image geometry (`vlgrpo.data.images`, which pulls in
transformers) is imported lazily and only to turn an image size into image tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vlgrpo.config import Config
from vlgrpo.memory.planner import DTYPE_BYTES, GB, OFFLOAD_TARGETS, PlanInput, plan, trainer_optimizer_states, verdicts
from vlgrpo.memory.specs import ModelSpec, PlanError, resolve_model
from vlgrpo.memory.suggest import not_run_by_trainer, suggestions


def image_tokens_for(width: int, height: int, min_pixels: int | None, max_pixels: int | None,
                     patch: int = 14, merge: int = 2) -> int:
    """Language-model tokens of one image after Qwen's smart_resize and the 2x2 merge."""
    from vlgrpo.data.images import ProcessorGeometry

    defaults = ProcessorGeometry()
    geometry = ProcessorGeometry(patch_size=patch, merge_size=merge, min_pixels=min_pixels or defaults.min_pixels,
                                 max_pixels=max_pixels or defaults.max_pixels)
    return geometry.num_image_tokens(height, width)


def plan_input_from_config(cfg: Config, *, params: int | None = None, image_size: tuple[int, int] = (448, 448),
                           text_tokens: int = 64) -> PlanInput:
    """The planner's input for a run config (`params` replaces the model spec; `image_size` is W x H)."""
    m, t, r = cfg.model, cfg.train, cfg.rollout
    spec: ModelSpec | None = None if params else resolve_model(m.name_or_path)
    frozen = {"vision": m.freeze_vision, "merger": m.freeze_merger, "language": m.freeze_language}
    offload = {"optimizer": t.zero3.offload_optimizer, "param": t.zero3.offload_param} if t.backend == "zero3" else {}
    patch, merge = (spec.patch, spec.merge) if spec else (14, 2)
    return PlanInput(
        spec=spec, params=params, dtype_bytes=DTYPE_BYTES[m.dtype],
        trainable=tuple(part for part, is_frozen in frozen.items() if not is_frozen),
        lora_rank=t.lora.rank if t.backend == "lora" else None, lora_targets=tuple(t.lora.target_modules),
        zero_stage=3 if t.backend == "zero3" else 0, num_gpus=t.num_gpus,
        offload=frozenset(k for k, on in offload.items() if on), beta=cfg.grpo.beta,
        optimizer_states=trainer_optimizer_states(t.backend, DTYPE_BYTES[m.dtype]),
        micro_batch=t.micro_batch_completions, prompts_per_step=t.prompts_per_step,
        completions_per_prompt=r.completions_per_prompt, text_tokens=text_tokens,
        image_tokens=image_tokens_for(*image_size, m.min_pixels, m.max_pixels, patch, merge),
        completion_tokens=r.max_new_tokens, max_prompt_length=cfg.data.max_prompt_length,
        gradient_checkpointing=m.gradient_checkpointing, engine=r.engine,
        vllm_gpu_memory_utilization=r.vllm.gpu_memory_utilization, vllm_placement=r.placement,
        rollout_gpus=r.vllm.rollout_gpus, vllm_sleep=r.vllm.enable_sleep_mode,
        tensor_parallel=r.vllm.tensor_parallel_size, vision_cache_bytes=r.vision_cache_bytes,
    )


def _inputs_dict(inp: PlanInput) -> dict[str, Any]:
    d = dataclasses.asdict(inp)
    d["offload"] = sorted(inp.offload)
    if inp.spec is not None:
        d["spec"]["params"] = {"vision": inp.spec.vision_params(), "merger": inp.spec.merger_params(),
                               "language": inp.spec.language_params(), "total": inp.spec.total_params()}
    return d


def build_report(inp: PlanInput, gpu_type: str = "A100-80GB") -> dict[str, Any]:
    """The whole plan as plain data (every size in bytes): the JSON of `vlgrpo plan --json`."""
    result = plan(inp)
    return {"inputs": _inputs_dict(inp), "counts": result["counts"], "per_gpu": result["per_gpu"],
            "cpu": result["cpu"], "conventions": result["conventions"], "warnings": result["warnings"],
            "not_run_by_trainer": not_run_by_trainer(inp), "verdicts": verdicts(inp, result["per_gpu"]),
            "suggestions": suggestions(inp, gpu_type)}


# One row per term: (key, label). Phase totals follow.
_ROWS = [
    ("weights", "policy weights"), ("gradients", "gradients"), ("optimizer", "optimiser states"),
    ("model_states", "= model states"), ("zero3_gather", "ZeRO-3 gathered layer"), ("reference", "reference model"),
    ("reward_model", "reward model"), ("critic", "critic (PPO)"), ("activations", "activations (1 micro-batch)"),
    ("logits", "log-prob logits"), ("zero3_rollout_gather", "ZeRO-3 weights gathered for rollout"),
    ("rollout_weights", "rollout engine weights"), ("kv_cache", "rollout KV cache"),
    ("vision_cache", "vision-feature cache"), ("overhead", "CUDA context + NCCL + slack"),
    ("train_phase", "peak in the update"), ("rollout_phase", "peak in the rollout"), ("total", "TOTAL need per GPU"),
]


def _gb(x: float) -> str:
    return f"{x / GB:8.2f}"


def _headline(report: dict[str, Any]) -> list[str]:
    i, c = report["inputs"], report["counts"]
    name = i["spec"]["name"] if i["spec"] else f"{c['total_params'] / 1e9:.2f} B parameters (--params)"
    method = f"LoRA r={i['lora_rank']}" if i["lora_rank"] else f"full fine-tune of {', '.join(i['trainable'])}"
    return [
        f"model: {name}  ({c['total_params'] / 1e9:.2f} B params, {c['trainable_params'] / 1e6:,.1f} M trainable)",
        f"{method}; ZeRO-{i['zero_stage']} over {c['train_gpus']} training GPU(s) of {i['num_gpus']}; "
        f"{i['dtype_bytes']}-byte dtype; offload: {', '.join(i['offload']) or 'none'}; beta={i['beta']}",
        f"per step and GPU: {i['prompts_per_step']} prompts x {i['completions_per_prompt']} completions; micro-batch "
        f"{i['micro_batch']}; tokens: {i['text_tokens']} text + {i['image_tokens']} image + {i['completion_tokens']} "
        f"completion; gradient checkpointing {'on' if i['gradient_checkpointing'] else 'off'}; engine {i['engine']}"
        + (f" ({i['vllm_placement']}, gpu_memory_utilization={i['vllm_gpu_memory_utilization']})"
           if i["engine"] == "vllm" else ""),
    ]


def format_report(report: dict[str, Any]) -> str:
    """The readable table: one row per term in GB per GPU, verdicts per GPU type, suggestions."""
    lines = _headline(report) + ["", f"{'term':<30}{'GB/GPU':>8}", "-" * 38]
    per_gpu = report["per_gpu"]
    for key, label in _ROWS:
        if key in ("train_phase", "total"):
            lines.append("-" * 38)
        if per_gpu[key] or key in ("model_states", "total"):
            lines.append(f"{label:<30}{_gb(per_gpu[key])}")
    if report["inputs"]["engine"] == "vllm":
        lines.append(f"(vLLM reserves gpu_memory_utilization={report['inputs']['vllm_gpu_memory_utilization']} x "
                     "capacity in the rollout: see each GPU type's peak below)")
    cpu = report["cpu"]
    if cpu["per_rank"]:
        lines.append(f"{'CPU memory per rank / all':<30}{_gb(cpu['per_rank'])} / {cpu['all_ranks'] / GB:.2f}")
    lines += ["", f"{'GPU':<12}{'capacity':>10}{'peak':>10}{'headroom':>10}  verdict (GB)"]
    for name, v in report["verdicts"].items():
        verdict = "fits" if v["fits"] else "does NOT fit"
        lines.append(f"{name:<12} {_gb(v['capacity_bytes'])}  {_gb(v['peak_bytes'])}  {_gb(v['headroom_bytes'])}  "
                     f"{verdict}")
    warnings = report["warnings"] + [f"{name}: {w}" for name, v in report["verdicts"].items() for w in v["warnings"]]
    lines += [f"warning: {w}" for w in warnings] + [f"note: {n}" for n in report["not_run_by_trainer"]]
    if report["suggestions"]:
        lines += ["", f"suggestions (to fit {report['suggestions'][0]['gpu_type']}):"]
        lines += [f"  peak {_gb(s['peak_bytes'])} GB  {'fits ' if s['fits'] else 'over '}  {s['change']}"
                  for s in report["suggestions"]]
    lines += ["", "conventions:"] + [f"  {k}: {v}" for k, v in report["conventions"].items()]
    return "\n".join(lines)


def parse_image_size(text: str) -> tuple[int, int]:
    """`WxH` -> (W, H), e.g. 448x448."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise PlanError(f"--image-size {text!r} must look like WIDTHxHEIGHT, e.g. 448x448") from None
    if w < 1 or h < 1:
        raise PlanError(f"--image-size {text!r}: width and height must be >= 1")
    return w, h


def parse_offload(text: str) -> frozenset[str]:
    """`optimizer,param` -> the offload set ('none' clears it)."""
    items = {x.strip() for x in text.split(",") if x.strip() and x.strip() != "none"}
    items = {"param" if x == "params" else x for x in items}
    bad = sorted(items - set(OFFLOAD_TARGETS))
    if bad:
        raise PlanError(f"--offload {bad}: accepted: {', '.join(OFFLOAD_TARGETS)} or none (comma-separated)")
    return frozenset(items)

