"""A run config as the planner's input: `plan_input_from_config`, with the image and video tokens the run's processor
geometry gives and what the plan made of --video-frames; and the token budget of a rollout, `total_length`
(rollout.max_total_length resolved).

Only this module, `deepspeed_json` (a zero3 run's offload) and `tiny_spec` know the config tree in memory/; the
checkpoint's geometry (`vlgrpo.data.images.checkpoint_geometry`) and the video sampling are imported where used.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from vlgrpo.config import Config, ModelConfig
from vlgrpo.config.prefill import prefill_once
from vlgrpo.config.sync import sync_mode
from vlgrpo.data.prompts import MAX_TOOL_TEXT_TOKENS, tool_response_markup
from vlgrpo.data.rowcheck import TOOL_RESPONSE_TOKENS, trajectory_tokens
from vlgrpo.memory.deepspeed_json import zero3_offload
from vlgrpo.memory.inputs import DTYPE_BYTES, PlanInput, train_gpus
from vlgrpo.memory.models import resolve_model
from vlgrpo.memory.specs import ModelSpec, PlanError
from vlgrpo.memory.terms import trainer_optimizer_states
from vlgrpo.memory.tokens import prompt_tokens

if TYPE_CHECKING:
    from vlgrpo.data.images import ProcessorGeometry


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


def most_image_tokens(geometry: ProcessorGeometry, max_pixels: int | None = None) -> int:
    """The most language-model tokens one image (or video frame) can take: smart_resize keeps its area within
    max_pixels (the geometry's unless given), so max_pixels / (patch x merge)^2."""
    return (max_pixels or geometry.max_pixels) // geometry.factor**2


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
        return most_image_tokens(geometry, hi)
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


def total_length(cfg: Config, geometry: ProcessorGeometry | None = None, tokenizer=None) -> int:
    """rollout.max_total_length resolved: the longest sequence a rollout may reach in tokens (the vLLM engine's
    max_model_len; a multi-turn trajectory ends there). Unset: data.max_prompt_length + `trajectory_tokens` with crops
    of the most tokens an image can take at `geometry` (the processor's; None: the checkpoint's, `geometry_for`) and
    each tool response's markup counted with `tokenizer` (None: Qwen's released tokenizers'), which for max_turns=1
    is data.max_prompt_length + rollout.max_new_tokens."""
    r = cfg.rollout
    if r.max_total_length is not None:
        return r.max_total_length
    if r.max_turns <= 1:  # no crop: no geometry to read
        return cfg.data.max_prompt_length + r.max_new_tokens
    crop = most_image_tokens(geometry if geometry is not None else geometry_for(cfg.model, None))
    # the longest opening a Qwen template writes of a turn: Qwen3.5's with thinking off (the engine writes it after
    # each tool response, as the template does)
    opening = "<think>\n\n</think>\n\n"
    markup = TOOL_RESPONSE_TOKENS if tokenizer is None else tool_response_markup(tokenizer, opening)
    return cfg.data.max_prompt_length + trajectory_tokens(r.max_new_tokens, r.max_turns, crop, markup)


def tool_notes(cfg: Config, inp: PlanInput) -> list[str]:
    """What the plan made of rollout.max_turns, and of rollout.max_total_length where it cut the trajectory short."""
    r = cfg.rollout
    if r.max_turns <= 1:
        return []
    whole = trajectory_tokens(r.max_new_tokens, r.max_turns, inp.image_tokens)
    cap = (
        f", capped at rollout.max_total_length={r.max_total_length} - {prompt_tokens(inp):,} prompt tokens"
        if inp.completion_tokens < whole
        else ""
    )
    return [
        f"rollout.max_turns={r.max_turns}: {inp.completion_tokens:,} tokens after the prompt planned ({r.max_turns} x "
        f"{r.max_new_tokens} sampled + {r.max_turns - 1} tool responses of up to {inp.image_tokens} crop tokens + "
        f"{TOOL_RESPONSE_TOKENS} markup + {MAX_TOOL_TEXT_TOKENS} text each{cap}); a row with crops runs whole in the "
        "update"
    ]


def judge_notes(cfg: Config, inp: PlanInput) -> list[str]:
    """What a recipe's `judge` costs per step, on the judge server's own GPUs (not in this plan): requests, and the
    tokens it prefills (the prompt template at ~4 characters a token, the question, a completion of at most
    rollout.max_new_tokens, the images with send_image) and decodes (reward.judge.max_tokens)."""
    j = cfg.reward.judge
    if "judge" not in cfg.reward.recipe or not j.base_url:
        return []
    requests = inp.prompts_per_step * inp.completions_per_prompt * train_gpus(inp)
    template = len(re.sub(r"\{\w+\}", "", j.prompt + j.system)) // 4
    images = inp.images_per_sample * inp.image_tokens if j.send_image else 0
    prompt = template + inp.text_tokens + cfg.rollout.max_new_tokens + images
    return [
        f"judge ({j.model} at {j.base_url}): at most {requests:,} requests per step ({inp.prompts_per_step} prompts x "
        f"{inp.completions_per_prompt} completions x {train_gpus(inp)} training GPUs; repeats are cached), each of "
        f"about {prompt:,} prompt tokens{' with the images' if images else ''} and up to {j.max_tokens} reply "
        f"tokens: about {requests * prompt:,} tokens prefilled per step on the judge's own GPUs, not planned here"
    ]


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
    data.video's pixel bound. A zero3 run's offload is what its DeepSpeed JSON says when it has one. The tokens after
    the prompt are a whole trajectory (`trajectory_tokens`, crops the size of one image), cut at
    rollout.max_total_length when it is set."""
    m, t, r = cfg.model, cfg.train, cfg.rollout
    if images_per_sample < 0 or video_frames < 0:
        raise PlanError(f"--images-per-sample {images_per_sample} / --video-frames {video_frames}: must be >= 0")
    if params:
        spec = None
    elif spec is None:
        spec = resolve_model(m.name_or_path)
    frozen = {"vision": m.freeze_vision, "merger": m.freeze_merger, "language": m.freeze_language}
    zero3 = t.backend == "zero3"
    arch = m.arch if m.arch != "auto" else spec.family if spec is not None else None
    sync = sync_mode(cfg, arch) if r.engine == "vllm" else (False, "")
    inp = PlanInput(
        spec=spec,
        params=params,
        dtype_bytes=DTYPE_BYTES[m.dtype],
        trainable=tuple(part for part, is_frozen in frozen.items() if not is_frozen),
        lora_rank=t.lora.rank if t.backend == "lora" else None,
        lora_targets=tuple(t.lora.target_modules),
        lora_experts=t.lora.experts,
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
        completion_tokens=trajectory_tokens(r.max_new_tokens, r.max_turns, image_tokens_for(*image_size, m, spec)),
        max_prompt_length=cfg.data.max_prompt_length,
        gradient_checkpointing=m.gradient_checkpointing,
        engine=r.engine,
        adapter_sync=sync[0],
        sync_why=sync[1],
        sync_bucket_mb=r.sync_bucket_mb,
        turn_kv=r.engine == "hf" and r.max_turns > 1,
        kept_prefill=prefill_once(cfg)[0],  # priced for a GPU: auto is off there, on is counted
        vllm_gpu_memory_utilization=r.vllm.gpu_memory_utilization,
        vllm_placement=r.placement,
        rollout_gpus=r.vllm.rollout_gpus,
        vllm_sleep=r.vllm.enable_sleep_mode,
        tensor_parallel=r.vllm.tensor_parallel_size,
        vision_cache_bytes=r.vision_cache_bytes,
    )
    if r.max_total_length is None:
        return inp
    room = max(r.max_total_length - prompt_tokens(inp), 0)  # the rollout ends a trajectory at max_total_length
    return dataclasses.replace(inp, completion_tokens=min(inp.completion_tokens, room))
