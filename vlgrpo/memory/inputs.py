"""What one plan takes: `PlanInput` (every number the arithmetic reads), the inputs it accepts and D, its training GPUs.

Pure data and validation: no arithmetic of bytes (`terms`), no config tree (`from_config.plan_input_from_config` maps
the config onto it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlgrpo.memory.specs import ModelSpec, PlanError

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
    lora_experts: bool = False
    """Adapters on a MoE's routed experts too (train.lora.experts)."""
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
    adapter_sync: bool = field(default=False, compare=False)
    """A LoRA run's policy reaches vLLM as its adapter alone (`rollout.adapters.sync_mode`), else the merged model.
    Reported, not priced: it moves no memory term (compare=False: two inputs that price alike are equal)."""
    sync_why: str = field(default="", compare=False)
    """Why the sync is the adapter alone or the merged model (printed by `vlgrpo plan`)."""
    kept_prefill: bool = False
    """The update takes the rollout's prompt prefill with its graph (`config.prefill.prefill_once`): the step's
    prompts' activations are held from the prefill through the decode and the update."""
    turn_kv: bool = False
    """Multi-turn rollouts on the HF engine: each trajectory keeps its whole KV (its prompt's copy included) from turn
    to turn, so a group holds G copies of the prompt's KV besides the shared one."""
    sync_bucket_mb: float = field(default=512.0, compare=False)
    """rollout.sync_bucket_mb (reported with the sync's size)."""
    vllm_gpu_memory_utilization: float = 0.5
    vllm_placement: str = "colocate"
    rollout_gpus: int = 0
    vllm_sleep: bool = True
    tensor_parallel: int = 1
    vision_cache_bytes: int = 2 * 1024**3
    overhead_bytes: int = 2 * 1024**3
    """CUDA context, NCCL buffers and allocator slack per GPU."""


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
