"""Loading the configuration: defaults <- YAML (only what differs) <- `a.b=c` overrides, then validation that
explains every rejection (the key, the accepted values, why). Also saving, dotted lookup and attribute docstrings.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from vlgrpo.config.judge import check_judge
from vlgrpo.config.schema import (
    CHOICES,
    EVAL_SUITES,
    RENAMED_KEYS,
    WATCHDOG_WAITING_GRACE,
    Config,
    ConfigError,
    check_mm_limits,
)
from vlgrpo.registry import BY_KEY
from vlgrpo.types import InputError

# ---------------------------------------------------------------- merging dicts into dataclasses


def _unknown_key(key: str, valid: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], valid, n=1)
    hint = f" Did you mean '{key.rsplit('.', 1)[0] + '.' if '.' in key else ''}{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key '{key}'. Accepted keys here: {', '.join(sorted(valid))}.{hint}")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML value to the annotated field type, or explain why it cannot be."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}' must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        if not math.isfinite(value):  # .inf / .nan would only surface later, as a NaN loss
            raise ConfigError(f"config key '{key}' must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, bool) and {"on", "off"} <= set(CHOICES.get(key, ())):
            return "on" if value else "off"  # YAML 1.1 reads on / off (data.thinking) as booleans
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be a string, got {value!r}")
        return str(value)
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    return value


def _apply(obj: Any, values: dict[str, Any], prefix: str = "") -> None:
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for k, v in values.items():
        key = f"{prefix}{k}"
        if k not in names:
            raise _unknown_key(key, names)
        current = getattr(obj, k)
        if dataclasses.is_dataclass(current):
            if not isinstance(v, dict):
                raise ConfigError(f"config key '{key}' is a section; give a mapping of its keys, got {v!r}")
            _apply(current, v, key + ".")
        else:
            setattr(obj, k, _coerce(v, hints[k], key))


def _dotted_to_nested(overrides: list[str]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value (e.g. train.lr=1e-5)")
        path, raw = item.split("=", 1)
        value = _parse_yaml(raw, f"override '{item}'") if raw.strip() else ""
        node = nested
        parts = path.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return nested


def _parse_yaml(text: str, source: str) -> Any:
    """YAML text -> data; a syntax error names `source` (the file or the override) and the line and column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{source} is not valid YAML{where}: {problem}") from None


def _leaf_keys(values: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for k, v in values.items():
        keys |= _leaf_keys(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}"}
    return keys


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- the prompt contract of model.name_or_path (its vlgrpo.json, when it has one) <- YAML file (only
    what differs) <- dotted overrides; then validate."""
    cfg = Config()
    explicit: set[str] = set()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file '{path}' does not exist")
        data = _parse_yaml(path.read_text(), f"config file '{path}'") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file '{path}' must hold a mapping of sections, got {type(data).__name__}")
        data = _renamed(data, f"config file '{path}'")
        try:
            _apply(cfg, data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
        explicit |= _leaf_keys(data)
    if overrides:
        nested = _renamed(_dotted_to_nested(overrides), "override")
        _apply(cfg, nested)
        explicit |= _leaf_keys(nested)
    _apply_checkpoint_contract(cfg, explicit)
    _canonical_values(cfg)
    validate(cfg)
    return cfg


def _deprecated(message: str) -> None:
    print(f"[vlgrpo] deprecated: {message}", file=sys.stderr)


def _renamed(values: dict[str, Any], source: str) -> dict[str, Any]:
    """`values` with every former key (RENAMED_KEYS) moved to its current name, each move reported once."""
    for old, new in RENAMED_KEYS.items():
        *old_path, old_leaf = old.split(".")
        node = values
        for part in old_path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or old_leaf not in node:
            continue
        value = node.pop(old_leaf)
        *new_path, new_leaf = new.split(".")
        target = values
        for part in new_path:
            target = target.setdefault(part, {})
        if new_leaf in target:
            raise ConfigError(f"{source} sets both '{old}' (its former name) and '{new}': keep only '{new}'")
        target[new_leaf] = value
        _deprecated(f"config key '{old}' is now '{new}' ({source}); the old name still works")
    return values


def _canonical_values(cfg: Config) -> None:
    """Former option names of registry keys (grpo.ratio=gspo) -> their current names, each reported."""
    for key, registry in BY_KEY.items():
        value = get_key(cfg, key)
        if isinstance(value, str):
            current, message = registry.canonical(value)
            if message:
                section, leaf = key.rsplit(".", 1)
                setattr(get_key(cfg, section), leaf, current)
                _deprecated(message)


def _apply_checkpoint_contract(cfg: Config, explicit: set[str]) -> None:
    """A checkpoint that vlgrpo exported says how it was prompted: those settings become the defaults."""
    from vlgrpo.config.contract import apply_contract, read_contract

    if not Path(cfg.model.name_or_path).is_dir():
        return
    contract = read_contract(cfg.model.name_or_path)
    if contract is not None:
        for note in apply_contract(cfg, contract, explicit):
            print(f"[vlgrpo] warning: {note}", file=sys.stderr)


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the fully resolved config (every key) as YAML; a run directory always holds one."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


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


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a config dataclass (the string literal under each field), for docs/--help."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = str(nxt.value.value).strip()  # type: ignore[union-attr]
    return docs
