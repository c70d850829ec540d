"""Per-GPU memory arithmetic of a GRPO run: one term per memory consumer, phase peaks, verdicts per GPU type.

Pure arithmetic on a small `PlanInput` (no torch, no config tree: `report.plan_input_from_config` maps the
config onto it). Every formula and assumption is written out in docs/memory.md. All sizes are bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vlgrpo.memory.specs import ModelSpec, PlanError, kv_cache_bytes, lora_params
from vlgrpo.memory.tokens import prompt_parts, prompt_tokens, visual_tokens

GB = 10**9  # decimal gigabyte: every printed "GB"
MIB = 2**20

# Total memory nvidia-smi reports for each card (the CUDA context is counted separately as `overhead`).
GPU_TYPES: dict[str, int] = {
    "A100-40GB": 40960 * MIB,
    "A100-80GB": 81920 * MIB,
    "H100-80GB": 81559 * MIB,
    "H200-141GB": 143771 * MIB,
}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
OFFLOAD_TARGETS = ("optimizer", "param", "reference", "reward")


@dataclass(frozen=True)
class PlanInput:
    """Everything one plan needs; build it from a config with `plan_input_from_config` or by hand."""

    spec: ModelSpec | None = None
    """Architecture; None plans model states only, for `params` parameters."""
    params: int | None = None
    """Parameter count when there is no spec (all of them trainable)."""
    largest_layer: int = 0
    """Largest layer's parameters when there is no spec (ZeRO-3 gather buffer)."""
    dtype_bytes: int = 2
    """Bytes of a weight / activation / KV element in the training dtype (bf16 2, fp32 4)."""
    trainable: tuple[str, ...] = ("language",)
    """Parts trained in a full fine-tune: any of vision, merger, language."""
    lora_rank: int | None = None
    """LoRA rank; None is a full fine-tune of `trainable`."""
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    zero_stage: int = 0
    num_gpus: int = 1
    offload: frozenset[str] = frozenset()
    """Any of optimizer, param (ZeRO-3), reference, reward: kept in CPU memory."""
    deepspeed_config: str | None = None
    """The DeepSpeed JSON a ZeRO-3 run reads (train.zero3.deepspeed_config). The trainer then takes offload from that
    file and ignores train.zero3.offload_*, so offload changes are suggested as edits of it."""
    optimizer_states: str = "fp32"
    """fp32: Adam with fp32 master + two fp32 moments; bf16: two 16-bit moments, no master copy."""
    convention: str = "16-byte"
    """16-byte (mixed precision) or 18-byte (DeepSpeed's estimators: + fp32 grads, + 4 B x largest layer)."""
    beta: float = 0.0
    """KL coefficient; 0 means no reference model."""
    reward_model_params: int = 0
    critic: bool = False
    """Add a PPO critic (value model of the policy's size) for comparison."""
    micro_batch: int = 8
    prompts_per_step: int = 2
    completions_per_prompt: int = 8
    text_tokens: int = 64
    image_tokens: int = 256
    """Language-model tokens of one image (after smart_resize and the 2x2 merge)."""
    images_per_sample: int = 1
    """Images in each prompt, each of `image_tokens` (0: video-only or text-only rows)."""
    video_frames: int = 0
    """Frames the model sees of each prompt's video after sampling (0: no video). `temporal_patch` frames make one
    temporal patch; an odd count is padded with the last frame, as Qwen's processors do."""
    video_frame_tokens: int = 0
    """Language-model tokens of one video frame at the video pixel bounds (data.video; qwen-vl-utils' default bound is
    768 merged tokens a frame)."""
    completion_tokens: int = 128
    max_prompt_length: int = 1024
    gradient_checkpointing: bool = False
    logits_chunk: int | None = None
    """Completion tokens whose logits are live at once in the log-prob pass (None: all of them)."""
    engine: str = "hf"
    vllm_gpu_memory_utilization: float = 0.5
    vllm_placement: str = "colocate"
    rollout_gpus: int = 0
    vllm_sleep: bool = True
    tensor_parallel: int = 1
    vision_cache_bytes: int = 2 * 1024**3
    overhead_bytes: int = 2 * 1024**3
    """CUDA context, NCCL buffers and allocator slack per GPU."""


# ---------------------------------------------------------------- the arithmetic


def _counts(inp: PlanInput) -> tuple[int, int, int]:
    """(total parameters, trainable parameters, largest layer)."""
    if inp.spec is None:
        if not inp.params or inp.params <= 0:
            raise PlanError("give a model (--model NAME_OR_PATH or model.name_or_path) or --params N > 0")
        return int(inp.params), int(inp.params), inp.largest_layer
    s = inp.spec
    parts = {"vision": s.vision_params(), "merger": s.merger_params(), "language": s.language_params()}
    if inp.lora_rank:  # frozen base + adapters
        adapters = lora_params(s, inp.lora_rank, inp.lora_targets)
        return s.total_params() + adapters, adapters, s.largest_layer_params()
    bad = [p for p in inp.trainable if p not in parts]
    if bad:
        raise PlanError(f"trainable parts {bad} are unknown; accepted: vision, merger, language")
    return s.total_params(), sum(parts[p] for p in inp.trainable), s.largest_layer_params()


def bytes_per_param(inp: PlanInput) -> dict[str, int]:
    """Bytes per trainable parameter of weights, gradients and optimiser states (before sharding)."""
    if inp.optimizer_states not in ("fp32", "bf16"):
        raise PlanError(f"optimizer states {inp.optimizer_states!r}; accepted: fp32, bf16")
    if inp.convention not in ("16-byte", "18-byte"):
        raise PlanError(f"convention {inp.convention!r}; accepted: 16-byte, 18-byte")
    w = 4 if inp.lora_rank else inp.dtype_bytes  # PEFT keeps adapters in fp32 (autocast_adapter_dtype)
    if inp.optimizer_states == "bf16":
        return {"weights": w, "gradients": w, "optimizer": 2 * 2}
    master = 4 if w < 4 else 0  # an fp32 master copy only when the weights are 16-bit
    extra_grad = 0
    if inp.convention == "18-byte" and w < 4:
        # DeepSpeed's estimators: ZeRO-1/2 count 2 B weights + 18 B states (bf16 + fp32 gradients, master, moments);
        # ZeRO-3 counts 18 B in all, i.e. one 4-byte gradient copy next to the 2-byte weights.
        extra_grad = 2 if inp.zero_stage == 3 else 4
    return {"weights": w, "gradients": w + extra_grad, "optimizer": master + 8}


def trainer_optimizer_states(backend: str, dtype_bytes: int) -> str:
    """The optimiser states a trainer backend keeps: plain runs torch's AdamW on the weights themselves (16-bit weights
    get 16-bit moments, no fp32 master copy); DeepSpeed (zero3) keeps an fp32 master and moments; LoRA adapters are
    fp32, so their moments are too."""
    return "bf16" if backend == "plain" and dtype_bytes == 2 else "fp32"


def train_gpus(inp: PlanInput) -> int:
    """D: data-parallel training GPUs (all of them, minus vLLM's own GPUs in split placement)."""
    split = inp.engine == "vllm" and inp.vllm_placement == "split"
    return inp.num_gpus - (inp.rollout_gpus if split else 0)


def check(inp: PlanInput) -> None:
    """Reject inputs the arithmetic would silently misread."""
    rules = [
        (inp.zero_stage in (0, 1, 2, 3), f"ZeRO stage {inp.zero_stage}; accepted: 0, 1, 2, 3"),
        (inp.engine in ("hf", "vllm"), f"rollout engine {inp.engine!r}; accepted: hf, vllm"),
        (
            inp.vllm_placement in ("colocate", "split"),
            f"vLLM placement {inp.vllm_placement!r}; accepted: colocate, split",
        ),
        (
            not inp.offload - set(OFFLOAD_TARGETS),
            f"--offload {sorted(inp.offload)}; accepted: {', '.join(OFFLOAD_TARGETS)}",
        ),
        (
            "param" not in inp.offload or inp.zero_stage == 3,
            "--offload param needs ZeRO-3 (--zero 3 or train.backend=zero3): only ZeRO-3 partitions weights",
        ),
        (
            inp.num_gpus >= 1 and train_gpus(inp) >= 1,
            f"no training GPUs: {inp.num_gpus} GPUs, {inp.rollout_gpus} of them for vLLM",
        ),
        (
            min(inp.micro_batch, inp.prompts_per_step, inp.completions_per_prompt, inp.tensor_parallel) >= 1,
            "micro-batch, prompts per step, completions per prompt and tensor parallel size must be >= 1",
        ),
        (
            min(inp.images_per_sample, inp.video_frames, inp.video_frame_tokens, inp.image_tokens) >= 0,
            "images per sample, video frames and tokens per image / frame must be >= 0",
        ),
        (not inp.video_frames or inp.video_frame_tokens, "a video of --video-frames F needs its tokens per frame"),
    ]
    for ok, why in rules:
        if not ok:
            raise PlanError(why)


def model_states(inp: PlanInput, trainable: int, total: int) -> dict[str, dict[str, int]]:
    """Weights, gradients and optimiser states on one GPU and in CPU memory, after ZeRO sharding and offload.

    ZeRO-1 shards optimiser states over D GPUs, ZeRO-2 also gradients, ZeRO-3 also weights. Offloading the
    optimiser moves the gradient partitions too from ZeRO-2 on (DeepSpeed's ZeRO-Offload).
    """
    d, bpp, z = train_gpus(inp), bytes_per_param(inp), inp.zero_stage
    weights = trainable * bpp["weights"] + (total - trainable) * inp.dtype_bytes  # frozen part in the model dtype
    terms = {
        "weights": weights / d if z >= 3 else weights,
        "gradients": trainable * bpp["gradients"] / (d if z >= 2 else 1),
        "optimizer": trainable * bpp["optimizer"] / (d if z >= 1 else 1),
    }
    on_cpu = {
        "optimizer": "optimizer" in inp.offload,
        "gradients": "optimizer" in inp.offload and z >= 2,
        "weights": "param" in inp.offload,
    }
    gpu = {k: 0 if on_cpu[k] else int(v) for k, v in terms.items()}
    cpu = {k: int(v) if on_cpu[k] else 0 for k, v in terms.items()}
    return {"gpu": gpu, "cpu": cpu}


def activation_bytes(inp: PlanInput, seq_len: int) -> int:
    """Saved activations of one micro-batch (flash/SDPA attention, so no T² term; docs/memory.md)."""
    s, b, mb = inp.spec, inp.dtype_bytes, inp.micro_batch
    if s is None:
        return 0
    # Per token per decoder layer: norm in, q_proj in, norm in, MLP in (h each); q, attn out (q each); k, v; gate, up,
    # act, product (I each); Qwen3's q_norm / k_norm also keep their inputs (q, kv). Qwen2: q = h, no q/k norms.
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    per_token = 4 * s.hidden + 2 * q + 2 * kv + 4 * s.intermediate + ((q + kv) if s.family == "qwen3_vl" else 0)
    per_layer = b * per_token * mb * seq_len
    lm = (b * s.hidden * mb * seq_len * s.layers + per_layer) if inp.gradient_checkpointing else per_layer * s.layers
    if "vision" not in inp.trainable or inp.lora_rank:
        return lm  # frozen ViT: features come from the cache, no graph through the tower
    patches = mb * visual_tokens(inp) * s.merge**2  # [mb, 4N] ViT tokens before the 2x2 merge: images and video
    mlp = 4 if s.family == "qwen2_5_vl" else 2  # SwiGLU saves gate, up, act, product; GELU MLP saves fc1, act
    per_vit = b * (8 * s.vision_hidden + mlp * s.vision_intermediate) * patches
    vit = (
        (b * s.vision_hidden * patches * s.vision_depth + per_vit)
        if inp.gradient_checkpointing
        else (per_vit * s.vision_depth)
    )
    return lm + vit


def step_features_bytes(inp: PlanInput) -> int:
    """The current step's visual features, B x N x h with N every image's and the video's merged tokens: the merged
    embeddings and, for Qwen3-VL, one DeepStack map of the same shape per DeepStack merger (the vision cache keeps them
    all, the prefill adds them to the first layers)."""
    s = inp.spec
    if s is None:
        return 0
    return inp.prompts_per_step * visual_tokens(inp) * s.hidden * inp.dtype_bytes * (1 + s.deepstack_mergers)


def logits_bytes(inp: PlanInput) -> int:
    """Log-prob pass: lm_head output + fp32 copy + fp32 log_softmax on the completion tokens (the shared-prefix pass
    asks for them only). Under gradient checkpointing the trainer forwards whole rows (prompt + completion,
    `policy.forward._completion_logits_full_rows`), whose lm_head output also covers the prompt:
    + mb x P_ids x V x b."""
    vocab = inp.spec.vocab if inp.spec else 0
    chunk = min(inp.logits_chunk or inp.completion_tokens, inp.completion_tokens)
    prompt = inp.micro_batch * prompt_tokens(inp) * vocab * inp.dtype_bytes if inp.gradient_checkpointing else 0
    return inp.micro_batch * chunk * vocab * (inp.dtype_bytes + 4 + 4) + prompt  # [mb, C, V] (+ [mb, P, V])


def rollout_terms(inp: PlanInput, engine_params: int) -> dict[str, int]:
    """Engine weights and KV cache on one rollout GPU (HF: the policy's own weights). Both engines keep a group's
    prompt KV once: vLLM by prefix caching, the HF engine's decode reads one copy per prompt for its G rows and
    preallocates each row's completion (`rollout.decode.SharedPrefixDecoder`)."""
    s, prompt, c, g = inp.spec, prompt_tokens(inp), inp.completion_tokens, inp.completions_per_prompt
    prompts = inp.prompts_per_step
    if inp.engine == "vllm" and inp.vllm_placement == "split":  # vLLM GPUs serve every training rank's prompts
        prompts = math.ceil(prompts * train_gpus(inp) / max(inp.rollout_gpus, 1))
    if inp.engine == "vllm":
        weights = engine_params * inp.dtype_bytes // inp.tensor_parallel
    else:
        weights = 0
    tokens = prompts * (prompt + g * c)  # the prompt's KV is stored once per group
    kv = 0 if s is None else kv_cache_bytes(s.layers, s.kv_heads, s.head_dim, 1, tokens, inp.dtype_bytes)
    return {"rollout_weights": weights, "kv_cache": kv // inp.tensor_parallel}


def plan(inp: PlanInput) -> dict[str, Any]:
    """Per-GPU and CPU bytes of every term, the phase totals and the conventions used."""
    check(inp)
    total, trainable, largest = _counts(inp)
    d, shard = train_gpus(inp), train_gpus(inp) if inp.zero_stage == 3 else 1
    states = model_states(inp, trainable, total)
    ref = total * inp.dtype_bytes // shard if inp.beta > 0 and not inp.lora_rank else 0  # LoRA: adapter disabled
    reward = inp.reward_model_params * inp.dtype_bytes // shard
    seq = prompt_tokens(inp) + inp.completion_tokens
    roll = rollout_terms(inp, total - trainable if inp.lora_rank else total)  # vLLM holds merged LoRA weights
    # ZeRO-3 gathers one full layer at a time: DeepSpeed's estimator counts it at 4 B, the 16-byte plan at the dtype
    gather = largest * (4 if inp.convention == "18-byte" else inp.dtype_bytes) if inp.zero_stage == 3 else 0
    g = {
        **states["gpu"],
        "model_states": sum(states["gpu"].values()),
        "zero3_gather": gather,
        "reference": 0 if "reference" in inp.offload else ref,
        "reward_model": 0 if "reward" in inp.offload else reward,
        "critic": sum(states["gpu"].values()) if inp.critic else 0,  # PPO: a value model mirroring the actor
        "activations": activation_bytes(inp, seq),
        "logits": logits_bytes(inp),
        **roll,
        "vision_cache": inp.vision_cache_bytes + step_features_bytes(inp),
        "overhead": inp.overhead_bytes,
    }
    resident = sum(
        g[k] for k in ("weights", "optimizer", "reference", "reward_model", "critic", "vision_cache", "overhead")
    )
    g["train_phase"] = resident + sum(g[k] for k in ("gradients", "zero3_gather", "activations", "logits"))
    split = inp.engine == "vllm" and inp.vllm_placement == "split"
    # ZeRO-3 training GPUs gather weights during rollout (the trainer's `rollout_weights`): the whole policy when the
    # HF engine decodes with it, only the vision tower + merger when vLLM decodes with its own copy.
    vision = (inp.spec.vision_params() + inp.spec.merger_params()) if inp.spec else 0
    gathered = vision if inp.engine == "vllm" else total
    g["zero3_rollout_gather"] = gathered * inp.dtype_bytes * (d - 1) // d if inp.zero_stage == 3 and not split else 0
    g["rollout_phase"] = (
        (g["overhead"] if split else resident) + g["zero3_rollout_gather"] + roll["rollout_weights"] + roll["kv_cache"]
    )
    g["total"] = max(g["train_phase"], g["rollout_phase"])
    cpu = {
        **states["cpu"],
        "reference": ref if "reference" in inp.offload else 0,
        "reward_model": reward if "reward" in inp.offload else 0,
        "rollout_weights_asleep": roll["rollout_weights"]
        if not split and inp.engine == "vllm" and inp.vllm_sleep
        else 0,
    }  # vLLM's sleep level 1 parks its weights in CPU memory during the update
    cpu["per_rank"] = sum(cpu.values())
    cpu["all_ranks"] = cpu["per_rank"] * d
    parts, prompt = prompt_parts(inp), prompt_tokens(inp)
    warnings = (
        []
        if prompt <= inp.max_prompt_length
        else [
            f"prompt of {prompt} tokens ({' + '.join(f'{k} {v}' for k, v in parts.items() if v)}) exceeds "
            f"data.max_prompt_length={inp.max_prompt_length}: training skips such rows (counted in "
            "data/overlong_rows), "
            "never cutting inside an image or a video"
        ]
    )
    counts = {
        "total_params": total,
        "trainable_params": trainable,
        "largest_layer_params": largest,
        "train_gpus": d,
        "prompt_parts": parts,
        "prompt_tokens": prompt,
        "visual_tokens": visual_tokens(inp),
        "sequence_tokens": seq,
    }
    return {"counts": counts, "per_gpu": g, "cpu": cpu, "conventions": conventions(inp), "warnings": warnings}


def conventions(inp: PlanInput) -> dict[str, str]:
    """Which convention each figure uses, in words (also printed under the table)."""
    b = bytes_per_param(inp)
    ds = inp.convention == "18-byte"
    return {
        "model_states": f"{inp.convention} convention: {b['weights']} B weights + {b['gradients']} B gradients + "
        f"{b['optimizer']} B optimiser states per trainable parameter"
        + (" (DeepSpeed's estimators: bf16 + fp32 gradients)" if ds else ""),
        "zero3_gather": f"ZeRO-3 only: largest layer x {4 if ds else inp.dtype_bytes} B"
        + (" (DeepSpeed's estimator)" if ds else ""),
        "units": "bytes; printed GB are decimal (1 GB = 1e9 B)",
        "activations": "flash/SDPA attention (no T^2 term); with checkpointing only each layer's input is kept",
        "logits": "lm_head output + fp32 copy + fp32 log_softmax on the completion tokens; with gradient "
        "checkpointing the lm_head output of the prompt too (whole rows)",
        "kv_cache": "2 x layers x kv_heads x head_dim x bytes per token; a group's prompt is stored once",
        "visual_tokens": "every image of a prompt and its video (frames / temporal patch x tokens per frame) in the "
        "prompt, the tower's patches (x merge^2) and the step's cached features",
        "zero3_rollout_gather": "ZeRO-3, colocated: the rest of the vision tower + merger (vLLM engine) or of the "
        "whole policy (HF engine) gathered on every training GPU during rollout",
    }


# ---------------------------------------------------------------- verdicts (suggestions: suggest.py)


def vllm_budget(inp: PlanInput, capacity: int) -> int:
    """Bytes vLLM claims on a card of `capacity` (its weights and KV blocks must fit in them)."""
    return int(inp.vllm_gpu_memory_utilization * capacity)


def phase_peaks_on(inp: PlanInput, per_gpu: dict[str, int], capacity: int) -> dict[str, int]:
    """Peak bytes of the update and of the rollout on a card of `capacity` (split placement: the rollout's on the
    vLLM GPUs).

    vLLM takes gpu_memory_utilization x capacity up front (weights + KV blocks) whatever the batch needs; with
    sleep mode it frees that during the update, without it the budget stays taken.
    """
    update, rollout = per_gpu["train_phase"], per_gpu["rollout_phase"]
    if inp.engine != "vllm":
        return {"update": update, "rollout": rollout}
    budget = vllm_budget(inp, capacity)
    if inp.vllm_placement == "split":
        return {"update": update, "rollout": per_gpu["overhead"] + budget}
    resident = rollout - per_gpu["rollout_weights"] - per_gpu["kv_cache"]
    return {"update": update + (0 if inp.vllm_sleep else budget), "rollout": resident + budget}


def peak_on(inp: PlanInput, per_gpu: dict[str, int], capacity: int) -> tuple[int, bool, list[str]]:
    """Peak bytes on a card of `capacity` (the larger phase), whether the rollout engine can start, and warnings."""
    peak = max(phase_peaks_on(inp, per_gpu, capacity).values())
    if inp.engine != "vllm":
        return peak, True, []
    budget = vllm_budget(inp, capacity)
    weights, kv = per_gpu["rollout_weights"], per_gpu["kv_cache"]
    warnings, startable = [], weights < budget
    if not startable:
        warnings.append(
            f"vLLM weights ({weights / GB:.1f} GB) exceed its budget ({budget / GB:.1f} GB): raise "
            f"rollout.vllm.gpu_memory_utilization above {weights / capacity:.2f}"
        )
    elif weights + kv > budget:
        u = math.ceil((weights + kv) / capacity * 20) / 20
        fix = f"rollout.vllm.gpu_memory_utilization={u:.2f} would hold them all" if u <= 1 else "lower B or G"
        warnings.append(
            f"KV cache of every sequence needs {kv / GB:.1f} GB, vLLM's budget leaves "
            f"{(budget - weights) / GB:.1f} GB: it will run fewer sequences at once (slower, not OOM); " + fix
        )
    return peak, startable, warnings


def verdict_reason(inp: PlanInput, per_gpu: dict[str, int], capacity: int) -> tuple[str, str]:
    """(the phase that peaks, why the run fits or not) on a card of `capacity`, with the numbers compared: the
    larger phase peak against the whole capacity (no margin), and vLLM's weights against its budget."""
    phases = phase_peaks_on(inp, per_gpu, capacity)
    phase = max(phases, key=phases.__getitem__)
    peak = phases[phase]
    over = [] if peak <= capacity else [f"{phase} peak {peak / GB:.2f} GB > {capacity / GB:.2f} GB capacity"]
    weights, budget = per_gpu["rollout_weights"], vllm_budget(inp, capacity)
    if inp.engine == "vllm" and weights >= budget:  # peak_on's startable test
        sign = ">" if weights > budget else ">="
        over.append(
            f"vLLM weights {weights / GB:.2f} GB {sign} its budget {budget / GB:.2f} GB "
            f"(gpu_memory_utilization {inp.vllm_gpu_memory_utilization} x {capacity / GB:.2f} GB): "
            "the engine cannot start"
        )
    return phase, "; ".join(over) or f"{phase} peak {peak / GB:.2f} GB <= {capacity / GB:.2f} GB capacity"


def verdicts(inp: PlanInput, per_gpu: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Fit, headroom (capacity - peak), the phase that peaks and the reason, on each GPU type."""
    out = {}
    for name, capacity in GPU_TYPES.items():
        peak, startable, warnings = peak_on(inp, per_gpu, capacity)
        phase, reason = verdict_reason(inp, per_gpu, capacity)
        out[name] = {
            "fits": peak <= capacity and startable,
            "headroom_bytes": capacity - peak,
            "capacity_bytes": capacity,
            "peak_bytes": peak,
            "peak_phase": phase,
            "reason": reason,
            "warnings": warnings,
        }
    return out
