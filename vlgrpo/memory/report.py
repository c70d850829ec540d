"""`vlgrpo plan` glue: map a run config onto a `PlanInput`, assemble the JSON report, render the table.

The only memory module that knows the config tree and reads the run's DeepSpeed JSON; the image geometry
(`vlgrpo.data.images`, whose smart_resize pulls in transformers) is imported lazily. The tiny model's sizes come in
as an argument: memory imports neither vlgrpo.tiny nor vlgrpo.models.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from vlgrpo.config import Config, ModelConfig
from vlgrpo.memory.planner import DTYPE_BYTES, GB, OFFLOAD_TARGETS, PlanInput, plan, trainer_optimizer_states, verdicts
from vlgrpo.memory.specs import FAMILIES, ModelSpec, PlanError, resolve_model
from vlgrpo.memory.suggest import not_run_by_trainer, suggestions


def geometry_for(m: ModelConfig, spec: ModelSpec | None):
    """The processor geometry the run uses: the spec's processor bounds when it knows them (init-tiny's), else the
    checkpoint directory's processor files, else the released processors of the spec's family (Qwen3-VL: 16 px
    patches, one token per 32 x 32 px; Qwen2/2.5-VL: 14 px, 28 x 28); model.min_pixels / max_pixels override them
    all. A `vlgrpo.data.images.ProcessorGeometry`."""
    from vlgrpo.data.images import ProcessorGeometry, checkpoint_geometry

    if spec is not None and spec.max_pixels:
        return ProcessorGeometry(
            patch_size=spec.patch,
            merge_size=spec.merge,
            temporal_patch_size=spec.temporal_patch,
            min_pixels=spec.min_pixels,
            max_pixels=spec.max_pixels,
        ).with_pixels(m.min_pixels, m.max_pixels)
    family = spec.family if spec else None
    return checkpoint_geometry(m.name_or_path, m.min_pixels, m.max_pixels, arch=family)[0]


def image_tokens_for(width: int, height: int, m: ModelConfig, spec: ModelSpec | None) -> int:
    """Language-model tokens of one W x H image after Qwen's smart_resize and the 2x2 merge, with the geometry the run
    uses (`geometry_for`)."""
    return geometry_for(m, spec).num_image_tokens(height, width)


def video_frames_seen(frames: int, max_frames: int) -> int:
    """Frames the model sees of a video given as `frames` frames, sampled as the data layer samples a frame list
    (`vlgrpo.data.video.list_indices`): every one, an odd count padded with the last; above max_frames, max_frames
    floored to even."""
    from vlgrpo.data.video import VideoSampling, list_indices

    return len(list_indices(frames, VideoSampling(max_frames=max_frames))[0]) if frames > 0 else 0


def video_frame_tokens_for(cfg: Config, spec: ModelSpec | None, frame_size: tuple[int, int] | None = None) -> int:
    """Language-model tokens of one video frame: a W x H frame resized by smart_resize within data.video's pixel
    bounds, or without `frame_size` the most a frame can take, max_pixels / (patch x merge)^2 (qwen-vl-utils'
    default bound: 768 tokens)."""
    from vlgrpo.data.video import VideoSampling

    geometry = geometry_for(cfg.model, spec)
    lo, hi = VideoSampling.from_config(cfg.data.video).pixel_bounds(geometry)
    if frame_size is None:
        return hi // geometry.factor**2
    return dataclasses.replace(geometry, min_pixels=lo, max_pixels=hi).num_image_tokens(frame_size[1], frame_size[0])


def video_notes(cfg: Config, frames: int) -> list[str]:
    """What the plan made of --video-frames: capped by data.video.max_frames, or padded to an even count."""
    seen, most = video_frames_seen(frames, cfg.data.video.max_frames), cfg.data.video.max_frames
    if frames <= 0:
        return []
    if frames > most:
        return [
            f"--video-frames {frames} is more than data.video.max_frames={most}: the model sees {seen} evenly "
            "spaced frames, which is what is planned"
        ]
    if seen != frames:
        return [f"--video-frames {frames} is odd: Qwen's processor pads it with the last frame to {seen}"]
    return []


def read_deepspeed_json(path: str) -> dict[str, Any]:
    """The DeepSpeed JSON of train.zero3.deepspeed_config, read from the current directory as the trainer does."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PlanError(
            f"train.zero3.deepspeed_config: cannot read '{path}' ({e}); a relative path is read from the "
            "current directory, as the trainer does"
        ) from None


def deepspeed_offload(ds: dict[str, Any]) -> frozenset[str]:
    """What a DeepSpeed JSON offloads: zero_optimization.offload_optimizer / offload_param with a device other than
    none (cpu, or nvme: planned as CPU memory)."""
    zero = ds.get("zero_optimization") or {}
    return frozenset(
        t
        for t in ("optimizer", "param")
        if str((zero.get(f"offload_{t}") or {}).get("device", "none")).lower() != "none"
    )


def zero3_offload(cfg: Config) -> frozenset[str]:
    """What the zero3 backend offloads: the DeepSpeed JSON's settings when train.zero3.deepspeed_config names one
    (`trainer.zero3.ds_config` then ignores train.zero3.offload_*), else those two keys."""
    z = cfg.train.zero3
    if z.deepspeed_config:
        return deepspeed_offload(read_deepspeed_json(z.deepspeed_config))
    return frozenset(t for t, on in (("optimizer", z.offload_optimizer), ("param", z.offload_param)) if on)


def config_notes(cfg: Config) -> list[str]:
    """JSON settings of a zero3 run's DeepSpeed file that the plan does not follow. (train.zero3.offload_* beside
    that file is a config error: `config/load.py` refuses it, since the file is what DeepSpeed runs.)"""
    t = cfg.train
    path = t.zero3.deepspeed_config
    if t.backend != "zero3" or not path:
        return []
    ds = read_deepspeed_json(path)
    notes = []
    stage = (ds.get("zero_optimization") or {}).get("stage", 0)
    if stage != 3:
        notes.append(
            f"{path} sets zero_optimization.stage={stage}: the zero3 backend is built for stage 3, which is "
            "what is planned; set it to 3"
        )
    precision = [
        name for key, name in (("bf16", "bfloat16"), ("fp16", "float16")) if (ds.get(key) or {}).get("enabled")
    ]
    if precision and precision[0] != cfg.model.dtype:
        notes.append(
            f"{path} enables {precision[0]} but model.dtype={cfg.model.dtype}: DeepSpeed computes in "
            f"{precision[0]}, the plan uses model.dtype; make the two agree"
        )
    return notes


def unbuilt_default_model(cfg: Config) -> bool:
    """model.name_or_path is still the config default and nothing is built there yet (no config.json)."""
    name = cfg.model.name_or_path
    return name == Config().model.name_or_path and not (Path(name) / "config.json").is_file()


def init_tiny_spec(tiny: Any, cfg: Config) -> tuple[ModelSpec, str]:
    """The spec of the model `vlgrpo model init-tiny --out <model.name_or_path>` builds, and a note saying so.

    `tiny` is a `TinySpec` (vlgrpo.tiny), passed in by the CLI: memory imports neither vlgrpo.tiny nor
    vlgrpo.models. Its vocab_size is the BPE's target; the trained tokenizer may come out a few tokens smaller."""
    arch = "qwen2_5_vl" if cfg.model.arch == "auto" else cfg.model.arch  # init-tiny's --arch default
    if arch not in FAMILIES:
        raise PlanError(
            f"model.arch={arch}: the planner counts the parameters of {', '.join(FAMILIES)} models; "
            "plan model states with --params N"
        )
    vision_mlp = tiny.vision_intermediate
    if arch == "qwen2_vl":  # Qwen2-VL's ViT MLP is mlp_ratio x embed_dim
        vision_mlp = tiny.vision_intermediate // tiny.vision_hidden * tiny.vision_hidden
    qwen3 = arch == "qwen3_vl"  # vlgrpo.tiny's Qwen3-VL: 16 px patches, 256 learned positions, DeepStack on
    name = cfg.model.name_or_path
    spec = ModelSpec(
        name=name,
        family=arch,
        hidden=tiny.hidden_size,
        intermediate=tiny.intermediate_size,
        layers=tiny.num_layers,
        heads=tiny.num_heads,
        kv_heads=tiny.num_kv_heads,
        head_dim=tiny.hidden_size // tiny.num_heads,
        vocab=tiny.vocab_size,
        tie_embeddings=tiny.tie_word_embeddings,
        vision_depth=tiny.vision_depth,
        vision_hidden=tiny.vision_hidden,
        vision_intermediate=vision_mlp,
        patch=16 if qwen3 else 14,
        position_embeddings=256 if qwen3 else 0,
        deepstack_mergers=len(tiny.deepstack_visual_indexes) if qwen3 else 0,
        min_pixels=tiny.min_pixels,
        max_pixels=tiny.max_pixels,
    )
    flag = "" if arch == "qwen2_5_vl" else f" --arch {arch}"
    note = (
        f"model.name_or_path={name} (the config default) is not built yet: planned the tiny {arch} that "
        f"`vlgrpo model init-tiny --out {name}{flag}` builds there. A real model: vlgrpo plan --model "
        "qwen2.5-vl-7b --gpus 8 --lora-rank 16, or a recipe such as configs/qwen2_5_vl_7b_lora_8xa100.yaml"
    )
    return spec, note


def plan_input_from_config(
    cfg: Config,
    *,
    params: int | None = None,
    spec: ModelSpec | None = None,
    image_size: tuple[int, int] = (448, 448),
    text_tokens: int = 64,
    images_per_sample: int = 1,
    video_frames: int = 0,
    video_size: tuple[int, int] | None = None,
) -> PlanInput:
    """The planner's input for a run config (`params` replaces the model spec, `spec` the one model.name_or_path
    names; `image_size` is W x H). Each prompt holds `images_per_sample` images of `image_size` and, with
    `video_frames` > 0, a video of that many frames (sampled as data.video says), each frame of `video_size` or at
    data.video's pixel bound. A zero3 run's offload is what its DeepSpeed JSON says when it has one."""
    m, t, r = cfg.model, cfg.train, cfg.rollout
    if images_per_sample < 0 or video_frames < 0:
        raise PlanError(f"--images-per-sample {images_per_sample} / --video-frames {video_frames}: must be >= 0")
    if params:
        spec = None
    elif spec is None:
        spec = resolve_model(m.name_or_path)
    frozen = {"vision": m.freeze_vision, "merger": m.freeze_merger, "language": m.freeze_language}
    zero3 = t.backend == "zero3"
    return PlanInput(
        spec=spec,
        params=params,
        dtype_bytes=DTYPE_BYTES[m.dtype],
        trainable=tuple(part for part, is_frozen in frozen.items() if not is_frozen),
        lora_rank=t.lora.rank if t.backend == "lora" else None,
        lora_targets=tuple(t.lora.target_modules),
        zero_stage=3 if zero3 else 0,
        num_gpus=t.num_gpus,
        offload=zero3_offload(cfg) if zero3 else frozenset(),
        deepspeed_config=t.zero3.deepspeed_config if zero3 else None,
        beta=cfg.grpo.beta,
        optimizer_states=trainer_optimizer_states(t.backend, DTYPE_BYTES[m.dtype]),
        micro_batch=t.micro_batch_completions,
        prompts_per_step=t.prompts_per_step,
        completions_per_prompt=r.completions_per_prompt,
        text_tokens=text_tokens,
        image_tokens=image_tokens_for(*image_size, m, spec),
        images_per_sample=images_per_sample,
        video_frames=video_frames_seen(video_frames, cfg.data.video.max_frames) if video_frames else 0,
        video_frame_tokens=video_frame_tokens_for(cfg, spec, video_size) if video_frames else 0,
        completion_tokens=r.max_new_tokens,
        max_prompt_length=cfg.data.max_prompt_length,
        gradient_checkpointing=m.gradient_checkpointing,
        engine=r.engine,
        vllm_gpu_memory_utilization=r.vllm.gpu_memory_utilization,
        vllm_placement=r.placement,
        rollout_gpus=r.vllm.rollout_gpus,
        vllm_sleep=r.vllm.enable_sleep_mode,
        tensor_parallel=r.vllm.tensor_parallel_size,
        vision_cache_bytes=r.vision_cache_bytes,
    )


def _inputs_dict(inp: PlanInput) -> dict[str, Any]:
    d = dataclasses.asdict(inp)
    d["offload"] = sorted(inp.offload)
    if inp.spec is not None:
        d["spec"]["params"] = {
            "vision": inp.spec.vision_params(),
            "merger": inp.spec.merger_params(),
            "language": inp.spec.language_params(),
            "total": inp.spec.total_params(),
        }
    return d


def build_report(inp: PlanInput, gpu_type: str = "A100-80GB", config_notes: list[str] | None = None) -> dict[str, Any]:
    """The whole plan as plain data (every size in bytes): the JSON of `vlgrpo plan --json`. `config_notes` say how
    the run config was read (printed under the headline)."""
    result = plan(inp)
    return {
        "inputs": _inputs_dict(inp),
        "config_notes": list(config_notes or []),
        "counts": result["counts"],
        "per_gpu": result["per_gpu"],
        "cpu": result["cpu"],
        "conventions": result["conventions"],
        "warnings": result["warnings"],
        "not_run_by_trainer": not_run_by_trainer(inp),
        "verdicts": verdicts(inp, result["per_gpu"]),
        "suggestions": suggestions(inp, gpu_type),
    }


# One row per term: (key, label). Phase totals follow.
_ROWS = [
    ("weights", "policy weights"),
    ("gradients", "gradients"),
    ("optimizer", "optimiser states"),
    ("model_states", "= model states"),
    ("zero3_gather", "ZeRO-3 gathered layer"),
    ("reference", "reference model"),
    ("reward_model", "reward model"),
    ("critic", "critic (PPO)"),
    ("activations", "activations (1 micro-batch)"),
    ("logits", "log-prob logits"),
    ("zero3_rollout_gather", "ZeRO-3 weights gathered for rollout"),
    ("rollout_weights", "rollout engine weights"),
    ("kv_cache", "rollout KV cache"),
    ("vision_cache", "vision-feature cache"),
    ("overhead", "CUDA context + NCCL + slack"),
    ("train_phase", "peak in the update"),
    ("rollout_phase", "peak in the rollout"),
    ("total", "TOTAL need per GPU"),
]


_LABEL = 36  # width of the term column


def _gb(x: float) -> str:
    return f"{x / GB:8.2f}"


def _count(n: int) -> str:
    """A parameter count: 8.29 B, or 1.11 M for a tiny model."""
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _headline(report: dict[str, Any]) -> list[str]:
    i, c = report["inputs"], report["counts"]
    name = i["spec"]["name"] if i["spec"] else f"{_count(c['total_params'])} parameters (--params)"
    method = f"LoRA r={i['lora_rank']}" if i["lora_rank"] else f"full fine-tune of {', '.join(i['trainable'])}"
    source = f" (from {i['deepspeed_config']})" if i["deepspeed_config"] else ""
    return [
        f"model: {name}  ({_count(c['total_params'])} params, {c['trainable_params'] / 1e6:,.1f} M trainable)",
        f"{method}; ZeRO-{i['zero_stage']} over {c['train_gpus']} training GPU(s) of {i['num_gpus']}; "
        f"{i['dtype_bytes']}-byte dtype; offload: {', '.join(i['offload']) or 'none'}{source}; beta={i['beta']}",
        f"per step and GPU: {i['prompts_per_step']} prompts x {i['completions_per_prompt']} completions; micro-batch "
        f"{i['micro_batch']}; tokens: {_prompt_parts(report)} + {i['completion_tokens']} completion; gradient "
        f"checkpointing {'on' if i['gradient_checkpointing'] else 'off'}; engine {i['engine']}"
        + (
            f" ({i['vllm_placement']}, gpu_memory_utilization={i['vllm_gpu_memory_utilization']})"
            if i["engine"] == "vllm"
            else ""
        ),
    ]


def _prompt_parts(report: dict[str, Any]) -> str:
    """The prompt's tokens by part: `64 text + 256 image` for one image; with several images or a video e.g.
    `64 text + 2 images x 256 + video 8 x 768 (16 frames) = 6720 prompt`."""
    i, parts = report["inputs"], report["counts"]["prompt_parts"]
    n = i["images_per_sample"]
    out = [f"{parts['text']} text"]
    if n == 1:
        out.append(f"{parts['images']} image")
    elif n > 1:
        out.append(f"{n} images x {i['image_tokens']}")
    if i["video_frames"]:
        groups = parts["video"] // i["video_frame_tokens"]
        out.append(f"video {groups} x {i['video_frame_tokens']} ({i['video_frames']} frames)")
    if parts["video_timestamps"]:
        out.append(f"{parts['video_timestamps']} timestamp")
    if n == 1 and not i["video_frames"]:
        return " + ".join(out)  # the one-image form
    return " + ".join(out) + f" = {report['counts']['prompt_tokens']} prompt"


def format_report(report: dict[str, Any]) -> str:
    """The readable table: one row per term in GB per GPU, verdicts per GPU type, suggestions."""
    rule = "-" * (_LABEL + 8)
    lines = _headline(report) + [f"note: {n}" for n in report["config_notes"]]
    lines += ["", f"{'term':<{_LABEL}}{'GB/GPU':>8}", rule]
    per_gpu = report["per_gpu"]
    for key, label in _ROWS:
        if key in ("train_phase", "total"):
            lines.append(rule)
        if per_gpu[key] or key in ("model_states", "total"):
            lines.append(f"{label:<{_LABEL}}{_gb(per_gpu[key])}")
    if report["inputs"]["engine"] == "vllm":
        lines.append(
            f"(vLLM reserves gpu_memory_utilization={report['inputs']['vllm_gpu_memory_utilization']} x "
            "capacity in the rollout: see each GPU type's peak below)"
        )
    cpu = report["cpu"]
    if cpu["per_rank"]:
        lines.append(f"{'CPU memory per rank / all':<{_LABEL}}{_gb(cpu['per_rank'])} / {cpu['all_ranks'] / GB:.2f}")
    lines += ["", f"{'GPU':<12}{'capacity':>10}{'peak':>10}{'headroom':>10}  verdict and why (GB)"]
    for name, v in report["verdicts"].items():
        verdict = "fits" if v["fits"] else "does NOT fit"
        lines.append(
            f"{name:<12}  {_gb(v['capacity_bytes'])}  {_gb(v['peak_bytes'])}  {_gb(v['headroom_bytes'])}  "
            f"{verdict}: {v['reason']}"
        )
    warnings = report["warnings"] + [f"{name}: {w}" for name, v in report["verdicts"].items() for w in v["warnings"]]
    lines += [f"warning: {w}" for w in warnings] + [f"note: {n}" for n in report["not_run_by_trainer"]]
    if report["suggestions"]:
        lines += ["", f"suggestions (to fit {report['suggestions'][0]['gpu_type']}):"]
        lines += [
            f"  peak {_gb(s['peak_bytes'])} GB  {'fits ' if s['fits'] else 'over '}  {s['change']}"
            for s in report["suggestions"]
        ]
    lines += ["", "conventions:"] + [f"  {k}: {v}" for k, v in report["conventions"].items()]
    return "\n".join(lines)


def parse_image_size(text: str, flag: str = "--image-size") -> tuple[int, int]:
    """`WxH` -> (W, H), e.g. 448x448 (`flag` names the option in errors)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise PlanError(f"{flag} {text!r} must look like WIDTHxHEIGHT, e.g. 448x448") from None
    if w < 1 or h < 1:
        raise PlanError(f"{flag} {text!r}: width and height must be >= 1")
    return w, h


def parse_offload(text: str) -> frozenset[str]:
    """`optimizer,param` -> the offload set ('none' clears it)."""
    items = {x.strip() for x in text.split(",") if x.strip() and x.strip() != "none"}
    items = {"param" if x == "params" else x for x in items}
    bad = sorted(items - set(OFFLOAD_TARGETS))
    if bad:
        raise PlanError(f"--offload {bad}: accepted: {', '.join(OFFLOAD_TARGETS)} or none (comma-separated)")
    return frozenset(items)
