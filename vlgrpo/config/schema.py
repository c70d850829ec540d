"""The configuration schema: one tree of nested dataclasses with attribute docstrings, and the accepted values of
every choice key. Pure data: loading and overrides live in `vlgrpo.config.load`, validation in
`vlgrpo.config.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlgrpo.config.judge import JudgeConfig
from vlgrpo.registry import BY_KEY, EVAL_SUITE, TOOL
from vlgrpo.types import InputError

WATCHDOG_WAITING_GRACE = 1.5
"""A rank waiting in one of vlgrpo's collectives fires its watchdog after this many train.fault_timeout_s (the rank
that blocked elsewhere fires first and is named); trainer.watchdog reads it, validation checks it against
train.dist_timeout_s."""


class ConfigError(InputError):
    """A config key or value that cannot be accepted; the message names the key and the fix."""


@dataclass
class ModelConfig:
    name_or_path: str = "runs/tiny-qwen2_5_vl"
    """Local checkpoint directory or hub id of a Qwen2-VL, Qwen2.5-VL, Qwen3-VL or Qwen3.5 (dense) model."""
    arch: str = "auto"
    """Model family: auto (read config.json's model_type), qwen2_vl, qwen2_5_vl, qwen3_vl or qwen3_5. Decides the
    processor and the box convention (qwen2_vl: 0-1000 box tokens, qwen2_5_vl: resized-input pixels, qwen3_vl and
    qwen3_5: 0-1000 bbox_2d)."""
    dtype: str = "float32"
    """Weights dtype for training: float32, bfloat16 or float16 (not for qwen3_5: its Gated DeltaNet overflows in
    fp16; use bfloat16)."""
    attn_implementation: str = "sdpa"
    """Attention kernel: sdpa, eager or flash_attention_2."""
    min_pixels: int | None = None
    """Processor override: smallest image area in pixels (None keeps the checkpoint's)."""
    max_pixels: int | None = None
    """Processor override: largest image area in pixels; bounds image tokens per sample."""
    freeze_vision: bool = True
    """Freeze the vision tower (ViT blocks). Frozen -> cached vision features stay valid across steps."""
    freeze_merger: bool = True
    """Freeze the patch merger inside `visual` (it feeds the language model directly), and Qwen3-VL's DeepStack
    mergers with it. The plain and ZeRO-3 backends follow both switches; LoRA keeps the whole tower frozen."""
    freeze_language: bool = False
    """Freeze the language model (e.g. to train only the vision side)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""


@dataclass
class VideoConfig:
    fps: float = 2.0
    """Frames per second the model sees of a video (Qwen's default, qwen-vl-utils' FPS): a video file is sampled at
    this rate (at least 4 frames, an even count); a row's frame list is taken to have been recorded at it. A row's
    `video: {path: ..., fps: ...}` overrides it."""
    max_frames: int = 32
    """Most frames taken from one video (evenly spaced beyond it; a row's `video: {max_frames: ...}` overrides it).
    Two frames make one temporal patch: tokens = frames / 2 x tokens per frame."""
    min_pixels: int | None = None
    """Smallest area of a video frame in pixels (None: 128 tokens' worth, qwen-vl-utils' VIDEO_MIN_TOKEN_NUM x
    (patch x merge)^2, 100,352 px for Qwen2/2.5-VL)."""
    max_pixels: int | None = None
    """Largest area of a video frame in pixels (None: 768 tokens' worth, 602,112 px for Qwen2/2.5-VL); bounds a
    video's tokens together with max_frames."""


@dataclass
class DataConfig:
    train: str = "data/generated/shapes/train.jsonl"
    """Training set: a JSONL file, a saved HF dataset directory, a parquet file, or an image folder."""
    val: str | None = None
    """Validation set (same formats), used by in-loop eval."""
    test: str | None = None
    """Held-out test set, used by `vlgrpo eval` and the demo's before/after report."""
    format: str = "auto"
    """Adapter: auto (from the path), jsonl, hf, parquet or folder."""
    preset: str = "none"
    """Row shape of the data files: none (vlgrpo's row schema), llava (`conversations`), messages (chat messages with
    image parts), r1v (R1-V / VLM-R1 / Visual-RFT `problem` + `solution`), easyr1 (`images`, `problem`, `answer`) or
    deepeyes (DeepEyes-47k's verl rows: `prompt`, `images`, `reward_model`); see docs/adapt-your-dataset.md."""
    columns: dict[str, str] = field(default_factory=dict)
    """Column renames {target: source} applied before the preset; without one the targets are row fields, e.g.
    {question: problem, answer: solution}."""
    max_samples: int | None = None
    """Use at most this many training samples (None: all)."""
    shuffle: bool = True
    """Shuffle the training set each epoch (seeded by train.seed)."""
    system_prompt: str = ""
    """Optional system message placed before every question."""
    answer_format: str = "think_answer"
    """Format the model is asked for: think_answer (<think>..</think><answer>..</answer>) or answer."""
    thinking: str = "auto"
    """The chat template's thinking switch (enable_thinking): auto (the template's own default), on or off. Qwen3.5's
    template opens <think> in the generation prompt unless off (off closes an empty block: pair it with
    answer_format answer); where the prompt opens it (Qwen3-VL Thinking checkpoints always do), the completion is
    read, rewarded and scored as starting inside that block. Templates without the switch ignore it."""
    max_prompt_length: int = 1024
    """Longest prompt in tokens (text + image and video tokens); longer samples are reported and skipped."""
    video: VideoConfig = field(default_factory=VideoConfig)
    """How frames are taken from a row's video (docs/adapt-your-dataset.md, several images and video)."""


@dataclass
class VLLMConfig:
    gpu_memory_utilization: float = 0.5
    """Fraction of each rollout GPU that vLLM may take (weights + KV cache)."""
    tensor_parallel_size: int = 1
    """GPUs per vLLM engine (1 with rollout.placement=split)."""
    rollout_gpus: int = 0
    """With rollout.placement=split: how many of the node's GPUs run vLLM, one per training rank (the node's first
    GPUs train, rank k on GPU k; rank k's rollout worker takes the (training ranks + k)-th GPU)."""
    enable_sleep_mode: bool = True
    """With rollout.placement=colocate: free vLLM memory while the trainer updates."""
    mm_input: str = "embeds"
    """What vLLM receives for images: embeds (our cached features) or pixels (PIL images)."""
    limit_mm_per_prompt: dict[str, int] = field(default_factory=lambda: {"image": 4, "video": 1})
    """Most images and videos one prompt may hold, {image: n, video: 0 or 1} (a key left out is 0): vLLM reserves
    memory for that many parts per prompt, and a row with more is refused, naming the sample and this key."""
    engine_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments of `vllm.LLM`, over vlgrpo's own (e.g. {enforce_eager: true, block_size: 16})."""
    adapter_sync: bool | None = None
    """With train.backend=lora: vLLM applies the LoRA adapter itself (enable_lora) and each step sends the adapter
    alone, under a versioned name (MBs instead of the whole model; vLLM keys its prefix cache by adapter, so two
    policies never share an entry). null (default): on for an arch whose adapter vLLM has been shown to serve
    (Qwen2.5-VL: the log-prob gap measured in the tests), else off (Qwen3-VL, Qwen3.5: its Gated DeltaNet projections
    are LoRA targets vLLM's LoRA path is not shown to serve); `vlgrpo plan` says which. false, or LoRA on the vision
    tower (vLLM leaves tower adapters out): the merged weights, computed into new tensors (the trainer's base is
    never written)."""


@dataclass
class RolloutConfig:
    engine: str = "hf"
    """Generation backend: hf (transformers, runs anywhere) or vllm (GPU)."""
    placement: str = "colocate"
    """colocate (the engine shares the trainer's devices and waits for its update) or split (the engine samples the
    next batches in a worker process of each training rank while the trainer updates; vLLM there runs on a GPU of its
    own, see rollout.vllm.rollout_gpus; formerly rollout.vllm.placement)."""
    max_staleness: int | None = None
    """How many policy versions a group may be behind the weights it is trained with (null: 0 when colocated, 1
    with placement=split). The worker waits rather than sample further ahead; nothing is dropped."""
    completions_per_prompt: int = 8
    """G: completions sampled for every prompt; the GRPO group size."""
    max_new_tokens: int = 128
    """Longest completion in tokens."""
    temperature: float = 1.0
    """Sampling temperature (GRPO needs diversity: keep near 1)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = 0
    """Top-k sampling (0 disables)."""
    stop: list[str] = field(default_factory=list)
    """Extra stop strings besides EOS."""
    tools: list[str] = field(default_factory=list)
    """Tools the policy may call (thinking with images): zoom_in (the crop comes back as a new image; the model calls
    it image_zoom_in_tool), module:function or file.py:function. Needs max_turns >= 2 and a frozen vision tower and
    merger (or the LoRA backend)."""
    max_turns: int = 1
    """Turns a trajectory may take: each tool call and its response begin another (1: one-turn rollouts)."""
    over_turn_masking: bool = False
    """Trajectories still calling a tool at max_turns get advantage 0 (Mini-o3): no penalty for the cap."""
    max_total_length: int | None = None
    """Longest sequence a rollout may reach in tokens: the prompt, every turn and every tool response with its crop.
    The vLLM engine's max_model_len; a turn whose prompt + max_new_tokens would pass it is not started, and the
    trajectory finishes as "max_total_length". null: data.max_prompt_length + what max_turns turns can add (each
    max_new_tokens, and between two a tool response with a crop of at most model.max_pixels); for max_turns=1 that is
    data.max_prompt_length + max_new_tokens. At least that sum when set."""
    vision_cache_dir: str | None = None
    """On-disk vision-feature cache directory (None: memory only)."""
    vision_cache_bytes: int = 2 * 1024**3
    """Byte budget of the in-memory vision-feature LRU."""
    sync_bucket_mb: float = 512.0
    """Size of the buckets in which an engine with its own weights (vLLM, or any engine with placement=split) gets
    the weights that change after each step; with placement=split the trainer and the worker each hold two buffers of
    this size (or of the largest tensor, if larger): one in flight while the next is packed."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class OverlongConfig:
    enabled: bool = False
    """DAPO overlong shaping: penalise completions near or past the length limit."""
    max_length: int = 128
    """L: length at which the penalty reaches -1 (usually rollout.max_new_tokens)."""
    cache_length: int = 32
    """C: width of the linear penalty ramp before L."""


@dataclass
class RewardConfig:
    recipe: dict[str, float] = field(default_factory=lambda: {"accuracy": 1.0, "format": 0.5})
    """Named reward components and their weights; names come from the registry or `module:function`."""
    box_format: str = "auto"
    """Box convention of the model's output: auto (from model.arch), qwen2, qwen2_5, qwen3 or plain."""
    gate_accuracy_on_format: bool = False
    """Count accuracy only when the format holds (closes the format-up, accuracy-flat hack)."""
    format_requires_answer: bool = True
    """The format reward also needs an answer that parses for the row's answer_type: a number, an option letter,
    yes/no, a math_verify expression, a box, or non-empty text (so `<answer>banana</answer>` cannot farm it)."""
    number_atol: float = 0.0
    """Absolute tolerance of numeric answers."""
    number_rtol: float = 0.0
    """Relative tolerance of numeric answers."""
    iou_threshold: float = 0.5
    """Threshold of the thresholded-IoU grounding reward."""
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)


@dataclass
class GRPOConfig:
    advantage: str = "group"
    """group ((r-mean)/(std+eps), sample std), group_mean (Dr.GRPO, no std) or batch (batch std)."""
    std_eps: float = 1e-4
    """epsilon added to the std in the advantage denominator (TRL's 1e-4)."""
    ratio: str = "token"
    """Importance-ratio level: token (GRPO), sequence (GSPO) or sequence_token; formerly grpo.loss=grpo/gspo/..."""
    aggregation: str = "token-mean"
    """token-mean (DAPO), seq-mean-token-mean (original GRPO) or seq-mean-token-sum-norm (Dr.GRPO)."""
    clip_low: float = 0.2
    """epsilon_low of the clipped surrogate (GSPO: 3e-4)."""
    clip_high: float = 0.28
    """epsilon_high of the clipped surrogate (DAPO clip-higher 0.28; GSPO: 4e-4)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (None disables)."""
    beta: float = 0.0
    """KL coefficient of the k3 estimator against the reference policy; 0 skips the reference pass."""
    num_iterations: int = 1
    """Policy updates per rollout batch (>1 needs old log-probs)."""
    dynamic_sampling: bool = False
    """Drop zero-variance groups and top the batch up with fresh prompts."""
    max_topup_rounds: int = 2
    """Extra sampling rounds allowed to refill a batch under dynamic sampling."""
    rollout_is: str = "auto"
    """Rollout importance sampling against the engine/trainer log-prob gap: token_truncate, token_mask,
    sequence_truncate, sequence_mask or none; auto = sequence_mask with vLLM (TRL 1.16's default), none with hf."""
    rollout_is_cap: float = 3.0
    """Cap of the rollout IS weight: truncate modes clip at it, mask modes zero weights above it (TRL: 3.0)."""
    rollout_is_sequence: str = "product"
    """Sequence modes' ratio: product of the token ratios (TRL) or geometric_mean (ms-swift)."""
    decoupled: bool = False
    """rollout.placement=split, stale groups: AReaL's decoupled objective. The ratio's base is the trainer's current
    (proximal) policy, from one extra forward pass per step, and the behaviour policy that sampled enters as rollout
    IS weights exp(proximal - behaviour) (grpo.rollout_is; auto = token_truncate at grpo.rollout_is_cap, AReaL's
    capped behaviour weight). Off: the behaviour log-probs are the ratio's base (no extra pass)."""


ATTENTION_MLP_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GATED_DELTANET_LINEARS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")  # Qwen3.5's linear layers


@dataclass
class LoRAConfig:
    rank: int = 16
    """LoRA rank r."""
    alpha: int = 32
    """LoRA scaling alpha (effective scale alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA input."""
    target_modules: list[str] = field(default_factory=lambda: [*ATTENTION_MLP_LINEARS, *GATED_DELTANET_LINEARS])
    """Linear layers of the language model that get adapters (never the vision tower unless listed). The in_proj_* and
    out_proj names are Qwen3.5's Gated DeltaNet projections (other families have none); its conv1d, A_log and dt_bias
    are not linear layers and train only in a full fine-tune (plain, zero3)."""
    experts: bool = False
    """Mixture-of-experts models: adapters on every routed expert's weights too (peft's `target_parameters` on the
    fused `mlp.experts.gate_up_proj` and `down_proj`: rank r per expert). Off: the experts stay frozen and only the
    linear layers above (attention, a Qwen3.5-MoE shared expert's MLP) adapt, as most MoE LoRA recipes start."""


@dataclass
class Zero3Config:
    deepspeed_config: str | None = None
    """Path of a DeepSpeed JSON; None builds one from the fields below."""
    offload_optimizer: bool = False
    """Keep optimiser states in CPU memory (without deepspeed_config; with it, set the offload in that file)."""
    offload_param: bool = False
    """Keep partitioned parameters in CPU memory (without deepspeed_config; with it, set the offload in that file)."""


@dataclass
class TrainConfig:
    stage: str = "grpo"
    """grpo (reinforcement learning) or sft (teacher-forced cold start on gold answers)."""
    backend: str = "plain"
    """plain (single process, all weights), lora (peft adapters) or zero3 (DeepSpeed ZeRO-3)."""
    prompts_per_step: int = 2
    """B: prompts sampled per optimiser step (per data-parallel rank)."""
    micro_batch_completions: int = 8
    """Completions per forward/backward pass; gradients accumulate over B*G / this many passes."""
    steps: int = 100
    """Optimiser steps to run."""
    lr: float = 1e-5
    """Peak learning rate."""
    warmup_steps: int = 0
    """Linear warm-up steps before the schedule."""
    lr_schedule: str = "constant"
    """constant or cosine (after warm-up)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 disables)."""
    prefill_once: str = "auto"
    """auto, on or off. On: an on-policy run with the colocated HF engine (num_iterations 1, plain or lora backend,
    frozen tower, no checkpointing, no tools) runs the rollout's prompt prefill with autograd and makes it the
    update's prompt pass (`policy.kept_prefill`): each step forwards its prompts once instead of twice, with the same
    gradient; the step's prompt activations are held from the prefill through the decode (`vlgrpo plan` counts
    them). auto: on when training on the CPU, off on a GPU (at 7B those activations are tens of GB). Off: the update
    prefills again. A mixture-of-experts model's update always prefills (its prompts' experts are routed there)."""
    routing_replay: str = "off"
    """Mixture-of-experts models (qwen3_vl_moe, qwen3_5_moe): off (each trainer pass routes every token itself) or
    rollout (R3: the experts the rollout chose for each token, prompt and completion, are forced in the old-log-prob,
    reference and update passes; the router still learns through the chosen experts' weights). Either way the
    engine records the experts and `moe/routing_mismatch` says how often the trainer's own choice differs. The HF
    engine records them; with vLLM or a multi-turn tool rollout it is refused."""
    router_aux_loss_coef: float = 0.0
    """Mixture-of-experts models: the weight of the routers' load-balancing loss (Switch Transformer's, as
    transformers' `load_balancing_loss_func`: E x sum_e (share of tokens routed to e) x (mean probability of e) per
    layer, averaged over layers; k at a perfect balance) added to the update's loss, logged as `moe/aux_loss`. 0
    (off) as peers' RL recipes: the policy gradient alone moves the routers."""
    max_nonfinite_steps: int = 3
    """Stop the run after this many steps in a row whose loss or gradient was NaN/inf (each one's optimiser step is
    skipped and counted in train/nonfinite_steps); the newest checkpoint is kept."""
    fault_timeout_s: float = 1800.0
    """A rank that makes no progress for this long (no phase of the step entered or left, and no beat from inside a
    long one: an eval batch, a checkpoint file, a weight-sync bucket; a blocked reward or image read, a collective
    another rank never entered) names its rank, step and phase and exits, and the launcher stops the others. A rank
    waiting in one of vlgrpo's own collectives fires after 1.5 x this, so the rank that blocked is the one named;
    that must come before train.dist_timeout_s (checked at load). Size it above the longest stretch without a beat:
    a 7B step's rollout or update takes minutes. 0 disables the watchdog."""
    dist_timeout_s: float = 3600.0
    """How long a rank waits in a collective (NCCL or gloo) for the others before the process group fails it:
    passed to init_process_group (NCCL's own default is 10 minutes, gloo's 30). Above 1.5 x train.fault_timeout_s, so
    the watchdog names a hung rank first; above the longest collective wait of a healthy run (a 7B ZeRO-3
    checkpoint of ~100 GB is written and checksummed while the other ranks wait)."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    output_dir: str = "runs/default"
    """Run directory: resolved config, metrics.jsonl, checkpoints."""
    save_every: int = 25
    """Checkpoint every N steps (0: only at the end), so a killed run resumes near where it stopped. A tiny run's
    checkpoint takes milliseconds; a 7B ZeRO-3 one holds ~110 GB (weights and Adam states) and takes a few minutes to
    write and checksum: its recipes set their own (docs/reliability.md)."""
    resume: bool = True
    """Resume from the newest checkpoint in output_dir when one exists."""
    num_gpus: int = 1
    """Data-parallel GPUs (for planning and launch scripts; torchrun sets the real world size)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    zero3: Zero3Config = field(default_factory=Zero3Config)


@dataclass
class EvalConfig:
    every_steps: int = 0
    """Run the in-loop eval every N steps (0 disables)."""
    suites: list[str] = field(default_factory=lambda: ["vqa"])
    """Eval suites: vqa (rows with a number/choice/yesno/text/math answer), grounding (rows of answer_type box),
    pope (images with >= 3 distinct `objects`, or eval.data a POPE question file). `vlgrpo train` and
    `vlgrpo data doctor` refuse a suite that the eval data gives nothing to run on."""
    data: str | None = None
    """Eval dataset (defaults to data.val)."""
    pope_parser: str = "pope"
    """POPE answer parser: pope, vlmevalkit or strict."""
    max_samples: int | None = 200
    """Evaluate at most this many samples per suite."""
    batch_prompts: int = 8
    """Prompts decoded together."""


@dataclass
class LoggingConfig:
    log_every: int = 1
    """Write metrics every N steps."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run directory."""
    wandb_project: str | None = None
    """Also log to this wandb project."""
    progress_bar: bool = True
    """Show a tqdm bar with step, reward, accuracy and s/step."""
    trajectories_every: int = 10
    """With rollout.tools: every N steps, write a few trajectories that called a tool (messages + crops) to
    <run>/trajectories/ (0: never)."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# Accepted values of the string-valued choice keys: the registries' names (vlgrpo/registry.py) and the plain value
# choices below; one table, used by validate(), the CLI and the docs.
CHOICES: dict[str, tuple[str, ...]] = {
    **{key: registry.names for key, registry in BY_KEY.items() if key not in (EVAL_SUITE.key, TOOL.key)},
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.attn_implementation": ("sdpa", "eager", "flash_attention_2"),
    "data.answer_format": ("think_answer", "answer"),
    "data.thinking": ("auto", "on", "off"),
    "rollout.placement": ("colocate", "split"),
    "rollout.vllm.mm_input": ("embeds", "pixels"),
    "grpo.rollout_is": ("auto", "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
    "grpo.rollout_is_sequence": ("product", "geometric_mean"),
    "train.stage": ("grpo", "sft"),
    "train.routing_replay": ("off", "rollout"),
    "train.prefill_once": ("auto", "on", "off"),
    "train.lr_schedule": ("constant", "cosine"),
}
EVAL_SUITES = EVAL_SUITE.names
RENAMED_KEYS: dict[str, str] = {"grpo.loss": "grpo.ratio", "rollout.vllm.placement": "rollout.placement"}
"""Former dotted config key -> its current name. The loader moves a former key to its current one with a deprecation
message; a former *value* of a registry key is mapped by the registry's aliases the same way."""
