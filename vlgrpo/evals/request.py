"""An eval request resolved once: what `vlgrpo eval` was asked (`EvalRequest`, parsed from the command line and
nothing else) and what it then runs with (`ResolvedEval`), each setting taken from the first that gives it:

    the flag  >  the run directory's config.yaml  >  the checkpoint's vlgrpo.json (prompt contract)  >  the default

A run directory's tools, max turns and turn budget come with it (`--tools none` turns them off), as its in-loop eval
rolls out; a contract's answer format, box convention, system prompt, thinking switch, video sampling and completion
budget. Knows nothing of engines or suites beyond their names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.data.video import VideoSampling
from vlgrpo.evals.source import EvalSource, resolve_source
from vlgrpo.evals.suite import PopeOptions
from vlgrpo.policy.prompt import PromptSettings
from vlgrpo.rewards.context import RewardContext
from vlgrpo.types import InputError

DEFAULT_MAX_NEW_TOKENS = 128
"""New tokens per completion for a checkpoint that does not say what it was trained with (a hub id)."""
DEFAULT_MAX_TURNS = 5
"""Turns a sample may take with --tools when neither the flag nor a run says."""


@dataclass(frozen=True)
class EngineOptions:
    """Which decoder runs the eval, and where."""

    kind: str = "hf"
    dtype: str = "float32"
    device: str | None = None
    """None: cuda when available, else cpu."""
    batch_prompts: int = 8
    engine_kwargs: dict = field(default_factory=dict)
    """vllm.LLM's keyword arguments (--engine vllm)."""
    gpu_memory_utilization: float = 0.8
    cache_dir: str | None = None
    """The on-disk vision-feature cache (None: in memory only)."""


@dataclass(frozen=True)
class EvalRequest:
    """`vlgrpo eval --model ...` as asked: None means "not given" (the run, the contract or the default decides)."""

    model: str
    out: str | Path = "eval_out"
    suites: str = "pope,grounding,vqa"
    data: str | None = None
    split: str | None = None
    max_samples: int | None = None
    max_new_tokens: int | None = None
    answer_format: str | None = None
    box_format: str | None = None
    tools: tuple[str, ...] | None = None
    """None: the run's rollout.tools (none for a checkpoint); (): no tools (--tools none)."""
    max_turns: int | None = None
    judge: str | None = None
    """None: no judge; "": the run's reward.judge; else a config file holding a reward.judge section."""
    pope: PopeOptions = PopeOptions()
    engine: EngineOptions = EngineOptions()
    progress: bool = True


@dataclass(frozen=True)
class ResolvedEval:
    """What the eval runs with, every setting decided."""

    source: EvalSource
    prompt: PromptSettings
    ctx: RewardContext
    """Gold-answer checks and scoring: the box convention, answer format, tolerances and judge."""
    max_new_tokens: int
    preset: str = "none"


def resolve(request: EvalRequest, run_cfg, contract, processor, arch: str) -> ResolvedEval:
    """The request with the run's config (or None) and the checkpoint's contract (or None) filled in, in the
    module's precedence; `processor` and `arch` are the loaded model's."""
    from vlgrpo.rewards import box_format_for_arch, context_from_config

    geometry = ProcessorGeometry.from_processor(processor)
    if run_cfg is not None:
        ctx = context_from_config(run_cfg, arch, geometry)
        prompt = PromptSettings.from_config(run_cfg, ctx.box_format, processor)
        data, preset, columns = (
            request.data or run_cfg.data.test or run_cfg.data.val,
            run_cfg.data.preset,
            dict(run_cfg.data.columns),
        )
        max_new_tokens = run_cfg.rollout.max_new_tokens
    else:
        ctx, prompt = _from_contract(contract, geometry, box_format_for_arch(arch))
        data, preset, columns = request.data, "none", {}
        max_new_tokens = (contract.max_new_tokens if contract else None) or DEFAULT_MAX_NEW_TOKENS
    ctx = dataclasses.replace(
        ctx,
        box_format=request.box_format or ctx.box_format,
        answer_format=request.answer_format or ctx.answer_format,
    )
    prompt = dataclasses.replace(
        prompt, box_format=ctx.box_format, answer_format=ctx.answer_format, **_turns(request, prompt)
    )
    if request.judge is not None:
        ctx = dataclasses.replace(ctx, judge=_judge(request.judge, run_cfg))
    if data is None and request.pope.data is None:
        raise InputError("no eval data: pass --data (a Sample dataset or a POPE question file) or set eval.data")
    source = resolve_source(data, split=request.split, preset=preset, columns=columns)
    return ResolvedEval(source, prompt, ctx, request.max_new_tokens or max_new_tokens, preset)


def _from_contract(contract, geometry: ProcessorGeometry, family_boxes: str) -> tuple[RewardContext, PromptSettings]:
    """How the checkpoint was trained to answer (its vlgrpo.json), else the family's boxes and the defaults."""
    if contract is None:
        ctx = RewardContext(box_format=family_boxes, geometry=geometry)
        return ctx, PromptSettings(answer_format=ctx.answer_format, box_format=ctx.box_format)
    ctx = RewardContext(box_format=contract.box_format, answer_format=contract.answer_format, geometry=geometry)
    v = contract.video
    video = (
        VideoSampling(float(v["fps"]), int(v["max_frames"]), int(v["min_pixels"] or 0), int(v["max_pixels"] or 0))
        if v is not None
        else VideoSampling()
    )
    prompt = PromptSettings(
        contract.answer_format, contract.box_format, contract.system_prompt, contract.thinking, video
    )
    return ctx, prompt


def _turns(request: EvalRequest, trained: PromptSettings) -> dict[str, Any]:
    """tools / max_turns / max_total_length: the flags, else the run's (its turn budget kept only with its tools)."""
    tools = trained.tools if request.tools is None else tuple(request.tools)
    if not tools:
        return {"tools": (), "max_turns": 1, "max_total_length": None}
    if request.tools is None:  # the run's own tools, turns and budget (a budget for other turns: the engine's)
        same = request.max_turns in (None, trained.max_turns)
        return {
            "tools": tools,
            "max_turns": request.max_turns or trained.max_turns,
            **({} if same else {"max_total_length": None}),
        }
    from vlgrpo.rollout.tools import tool_table

    tool_table(tools)  # an unknown tool or a user function that cannot load: before any decoding
    return {"tools": tools, "max_turns": request.max_turns or DEFAULT_MAX_TURNS, "max_total_length": None}


def _judge(arg: str, run_cfg):
    """The judge of `--judge [CONFIG]`: the config file's reward.judge, else (no file) the run directory's."""
    from vlgrpo.rewards.judge import Judge

    if arg:
        from vlgrpo.config import load_config

        settings, where = load_config(arg).reward.judge, f"--judge {arg}"
    elif run_cfg is not None:
        settings, where = run_cfg.reward.judge, "the run's config.yaml"
    else:
        raise InputError("--judge without a config file needs --model to be a run directory (its reward.judge)")
    if not (settings.base_url and settings.model):
        raise InputError(f"{where} has no reward.judge.base_url and reward.judge.model: no judge to score with")
    return Judge(settings)
