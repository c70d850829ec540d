"""Validation that explains every rejection of a loaded configuration: the key, the accepted values, why (ranges,
choices, and the combinations a run cannot execute: tools, placement, the length budget, the judge). Also dotted
lookup. Knows nothing of files or overrides (`load.py`).
"""

from __future__ import annotations

from typing import Any

from vlgrpo.config.judge import check_judge
from vlgrpo.config.schema import (
    CHOICES,
    EVAL_SUITES,
    WATCHDOG_WAITING_GRACE,
    Config,
    ConfigError,
)
from vlgrpo.registry import TOOL
from vlgrpo.types import InputError


def get_key(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for p in dotted.split("."):
        node = getattr(node, p)
    return node


# ---------------------------------------------------------------- validation that explains why


def _range_checks(cfg: Config) -> list[tuple[bool, str, str]]:
    """(holds, key, why) for every key whose value has a range."""
    r, t, g, v = cfg.rollout, cfg.train, cfg.grpo, cfg.data.video
    return [
        (r.completions_per_prompt >= 1, "rollout.completions_per_prompt", "must be >= 1"),
        (t.prompts_per_step >= 1, "train.prompts_per_step", "must be >= 1"),
        (t.micro_batch_completions >= 1, "train.micro_batch_completions", "must be >= 1"),
        (r.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1"),
        (r.temperature > 0, "rollout.temperature", "must be > 0 (GRPO samples; use eval for greedy decoding)"),
        (0 < r.top_p <= 1, "rollout.top_p", "must be in (0, 1]"),
        (t.steps >= 0, "train.steps", "must be >= 0"),
        (t.router_aux_loss_coef >= 0, "train.router_aux_loss_coef", "must be >= 0 (0: off)"),
        (t.lr > 0, "train.lr", "must be > 0"),
        (t.max_grad_norm >= 0, "train.max_grad_norm", "must be >= 0 (0 disables clipping)"),
        (t.save_every >= 0, "train.save_every", "must be >= 0 (0: checkpoint only at the end)"),
        (t.warmup_steps >= 0, "train.warmup_steps", "must be >= 0"),
        (t.max_nonfinite_steps >= 1, "train.max_nonfinite_steps", "must be >= 1"),
        (t.fault_timeout_s >= 0, "train.fault_timeout_s", "must be >= 0 seconds (0 disables the watchdog)"),
        (t.dist_timeout_s > 0, "train.dist_timeout_s", "must be > 0 seconds"),
        (
            t.fault_timeout_s * WATCHDOG_WAITING_GRACE < t.dist_timeout_s,
            "train.fault_timeout_s",
            f"x {WATCHDOG_WAITING_GRACE} ({t.fault_timeout_s * WATCHDOG_WAITING_GRACE:g} s, when a rank waiting for "
            f"the others gives up) must be below train.dist_timeout_s ({t.dist_timeout_s:g} s), or the process "
            "group fails the waiting ranks before the watchdog names the rank that hung: raise train.dist_timeout_s "
            "or lower train.fault_timeout_s",
        ),
        (cfg.logging.log_every >= 1, "logging.log_every", "must be >= 1 (1 logs every step)"),
        (cfg.eval.every_steps >= 0, "eval.every_steps", "must be >= 0 (0 disables)"),
        (g.clip_low >= 0 and g.clip_high >= 0, "grpo.clip_low/clip_high", "must be >= 0"),
        (g.beta >= 0, "grpo.beta", "must be >= 0"),
        (g.num_iterations >= 1, "grpo.num_iterations", "must be >= 1"),
        (g.dual_clip is None or g.dual_clip > 1, "grpo.dual_clip", "must be > 1 (or null to disable)"),
        (g.rollout_is_cap > 0, "grpo.rollout_is_cap", "must be > 0"),
        (t.lora.rank >= 1, "train.lora.rank", "must be >= 1"),
        (0 < r.vllm.gpu_memory_utilization <= 1, "rollout.vllm.gpu_memory_utilization", "must be in (0, 1]"),
        (cfg.data.max_prompt_length >= 1, "data.max_prompt_length", "must be >= 1"),
        (v.fps > 0, "data.video.fps", "must be > 0"),
        (v.max_frames >= 2, "data.video.max_frames", "must be >= 2 (two frames make one temporal patch)"),
        (
            (v.min_pixels or 0) >= 0 and (v.max_pixels or 0) >= 0,
            "data.video.min_pixels/max_pixels",
            "must be >= 1 (or null: Qwen's bounds)",
        ),
        (
            not (v.min_pixels and v.max_pixels) or v.min_pixels <= v.max_pixels,
            "data.video.min_pixels",
            "must not exceed data.video.max_pixels",
        ),
    ]


def validate(cfg: Config) -> None:
    """Reject invalid values and combinations with a message naming the key, accepted values and why."""
    for key, accepted in CHOICES.items():
        value = get_key(cfg, key)
        if value not in accepted:
            raise ConfigError(f"config key '{key}' = {value!r} is not accepted; use one of: {', '.join(accepted)}")
    r, t, g = cfg.rollout, cfg.train, cfg.grpo
    check_mm_limits(r.vllm.limit_mm_per_prompt)
    for ok, key, why in _range_checks(cfg):
        if not ok:
            raise ConfigError(f"config key '{key}' {why} (got {get_key(cfg, key) if '/' not in key else ''})")
    if t.stage == "grpo" and r.completions_per_prompt < 2:
        raise ConfigError(
            f"rollout.completions_per_prompt must be >= 2 for GRPO (got {r.completions_per_prompt}): every advantage "
            f"estimator (grpo.advantage={g.advantage} included) subtracts the group's mean reward, so a group of one "
            "has advantage 0 and never learns"
        )
    total = t.prompts_per_step * r.completions_per_prompt
    if total % t.micro_batch_completions:
        raise ConfigError(
            f"completions per step ({t.prompts_per_step} prompts x {r.completions_per_prompt} = {total}) must be "
            f"divisible by train.micro_batch_completions ({t.micro_batch_completions}), so every micro-batch is full"
        )
    if g.decoupled and r.placement != "split":
        raise ConfigError(
            "grpo.decoupled corrects groups sampled by an older policy version: it needs "
            "rollout.placement=split (a colocated engine samples with the current weights)"
        )
    if r.engine == "hf" and g.rollout_is not in ("auto", "none") and not g.decoupled:
        raise ConfigError(
            f"grpo.rollout_is={g.rollout_is} corrects for a rollout engine with its own copy of the weights "
            "(rollout.engine=vllm) or a stale split-rollout group (grpo.decoupled=true); the hf engine samples with "
            "the trainer's model itself: use auto or none"
        )
    _check_placement(cfg)
    z = t.zero3
    offload = [k for k in ("offload_optimizer", "offload_param") if getattr(z, k)]
    if z.deepspeed_config and offload:  # the JSON is handed to DeepSpeed as it is: the keys would do nothing
        what = " and ".join(f"zero_optimization.{k}.device: cpu" for k in offload)
        raise ConfigError(
            f"train.zero3.{offload[0]}=true is ignored when train.zero3.deepspeed_config is set "
            f"('{z.deepspeed_config}' is what DeepSpeed runs): set {what} in that file instead, or drop "
            "train.zero3.deepspeed_config to have vlgrpo build the DeepSpeed config from the train.zero3 keys"
        )
    if cfg.model.freeze_vision and cfg.model.freeze_merger and cfg.model.freeze_language and t.backend != "lora":
        raise ConfigError("model.freeze_vision, freeze_merger and freeze_language are all true: nothing would train")
    bad = [s for s in cfg.eval.suites if s not in EVAL_SUITES]
    if bad:
        raise ConfigError(f"config key 'eval.suites' has {bad}; accepted suites: {', '.join(EVAL_SUITES)}")
    if not cfg.reward.recipe:
        raise ConfigError("config key 'reward.recipe' is empty: name at least one reward, e.g. {accuracy: 1.0}")
    o = cfg.reward.overlong
    if o.enabled and not 0 < o.cache_length <= o.max_length:
        raise ConfigError(
            f"reward.overlong.cache_length ({o.cache_length}) must be in (0, reward.overlong.max_length={o.max_length}]"
        )
    _check_tools(cfg)
    _check_routing_replay(cfg)
    _check_total_length(cfg)
    try:
        check_judge(cfg.reward.judge, "judge" in cfg.reward.recipe)
    except InputError as e:
        raise ConfigError(str(e)) from None


def _check_tools(cfg: Config) -> None:
    """rollout.tools / max_turns: multi-turn rollouts run on either engine and placement with a frozen vision tower."""
    r = cfg.rollout
    if r.max_turns < 1:
        raise ConfigError(f"config key 'rollout.max_turns' must be >= 1 (got {r.max_turns})")
    unknown = [t for t in r.tools if t not in TOOL.names and ":" not in t]
    if unknown:
        raise ConfigError(
            f"config key 'rollout.tools' has {unknown}; accepted: {', '.join(TOOL.names)}, or a user function as "
            "module:function or path/to/file.py:function"
        )
    if bool(r.tools) != (r.max_turns > 1):
        raise ConfigError(
            f"rollout.tools={r.tools} with rollout.max_turns={r.max_turns}: tools need turns to answer in (max_turns "
            ">= 2), and more than one turn needs a tool to call (set both, e.g. tools: [zoom_in], max_turns: 5)"
        )
    m = cfg.model
    if r.tools and cfg.train.backend != "lora" and not (m.freeze_vision and m.freeze_merger):
        key = "model.freeze_vision" if not m.freeze_vision else "model.freeze_merger"
        raise ConfigError(
            f"rollout.tools does not run with {key}=false yet: the crops' features come from the vision cache, "
            "without the gradient a trainable tower or merger needs (keep both frozen, or train with LoRA)"
        )


def _check_routing_replay(cfg: Config) -> None:
    """train.routing_replay=rollout needs the experts the rollout chose: the HF engine records them for one-turn
    rollouts, colocated (the engine is the trainer's own model)."""
    r = cfg.rollout
    if cfg.train.routing_replay == "off":
        return
    why = [
        (
            r.engine != "hf",
            f"rollout.engine={r.engine}: vLLM's routed experts are not read back yet, so there is no "
            "rollout routing to replay",
        ),
        (bool(r.tools), "rollout.tools: a multi-turn rollout's later turns keep no routing record"),
        (r.placement != "colocate", f"rollout.placement={r.placement}: the split worker does not send its routing"),
    ]
    for bad, reason in why:
        if bad:
            raise ConfigError(f"train.routing_replay=rollout does not run with {reason}; use train.routing_replay=off")


def _check_placement(cfg: Config) -> None:
    """rollout.placement / max_staleness: what a rollout worker in its own process can run alongside."""
    r, t, g = cfg.rollout, cfg.train, cfg.grpo
    if r.max_staleness is not None and r.max_staleness < 0:
        raise ConfigError(f"rollout.max_staleness must be >= 0 (got {r.max_staleness})")
    if r.placement == "colocate" and r.max_staleness:
        raise ConfigError(
            f"rollout.max_staleness={r.max_staleness} needs rollout.placement=split: a colocated "
            "engine samples with the trainer's current weights, so its groups are never stale"
        )
    if r.placement != "split":
        return
    tp = r.vllm.tensor_parallel_size
    why = [
        (t.stage == "sft", "train.stage=sft samples nothing"),
        (g.num_iterations > 1, "grpo.num_iterations > 1 (the stale behaviour log-probs are the ratio's base)"),
        (
            r.engine == "vllm" and tp != 1,
            f"rollout.vllm.tensor_parallel_size={tp} (each training rank's worker "
            "runs one vLLM engine on one GPU; a daemon process, it cannot start tensor-parallel workers)",
        ),
        (
            r.engine == "vllm" and (r.top_p < 1 or r.top_k > 0) and r.max_staleness != 0 and not g.decoupled,
            "rollout.top_p < 1 or rollout.top_k > 0 and stale vLLM groups: vLLM's log-probs are renormalised "
            "over the kept tokens, so they cannot be the ratio's base; set grpo.decoupled=true or "
            "rollout.max_staleness=0",
        ),
    ]
    for bad, reason in why:
        if bad:
            raise ConfigError(f"rollout.placement=split does not run with {reason}")
    if r.engine == "vllm" and r.vllm.rollout_gpus < 1:
        raise ConfigError("rollout.placement=split needs rollout.vllm.rollout_gpus >= 1 (GPUs reserved for vLLM)")
    if r.engine == "vllm" and r.vllm.rollout_gpus >= t.num_gpus:
        raise ConfigError(
            f"rollout.vllm.rollout_gpus ({r.vllm.rollout_gpus}) must leave training GPUs out of "
            f"train.num_gpus ({t.num_gpus})"
        )


def _check_total_length(cfg: Config) -> None:
    """rollout.max_total_length: the longest prompt must have room for one whole turn."""
    r, least = cfg.rollout, cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    if r.max_total_length is not None and r.max_total_length < least:
        raise ConfigError(
            f"config key 'rollout.max_total_length' = {r.max_total_length} leaves no room for a turn after the longest "
            f"prompt: it must be at least data.max_prompt_length + rollout.max_new_tokens = "
            f"{cfg.data.max_prompt_length} + {r.max_new_tokens} = {least}, or null (that sum, plus what "
            f"rollout.max_turns={r.max_turns} turns and their crops add)"
        )


MM_MODALITIES = ("image", "video")
MM_LIMIT_KEY = "rollout.vllm.limit_mm_per_prompt"


def check_mm_limits(value) -> dict[str, int]:
    """`rollout.vllm.limit_mm_per_prompt` as vLLM takes it ({image: n, video: m}, a missing key 0): a ConfigError
    naming the key for another modality, a negative count, a video count above 1 (a prompt holds one video) or no
    part at all."""
    if not isinstance(value, dict):
        raise ConfigError(f"config key '{MM_LIMIT_KEY}' must be a mapping like {{image: 4, video: 1}}, got {value!r}")
    unknown = sorted(set(value) - set(MM_MODALITIES))
    if unknown:
        raise ConfigError(f"config key '{MM_LIMIT_KEY}' has {unknown}; accepted modalities: {', '.join(MM_MODALITIES)}")
    limits = {**{m: 0 for m in MM_MODALITIES}, **value}
    for m, n in limits.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"config key '{MM_LIMIT_KEY}.{m}' must be an integer >= 0, got {n!r}")
    if limits["video"] > 1:
        raise ConfigError(
            f"config key '{MM_LIMIT_KEY}.video' must be 0 or 1 (a vlgrpo prompt holds at most one "
            f"video), got {limits['video']}"
        )
    if limits["image"] + limits["video"] == 0:
        raise ConfigError(f"config key '{MM_LIMIT_KEY}' allows no image and no video: every vlgrpo prompt has one")
    return limits
