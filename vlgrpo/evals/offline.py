"""`vlgrpo eval --model PATH_OR_RUN`: load a checkpoint (or export a run's newest checkpoint), choose the decoder
(transformers or vLLM), run the suites through `evals.run.evaluate` and write the outputs.

Knows nothing of losses or optimisers; the training side is reached only through `export_run` for run directories.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

from vlgrpo.config.contract import CONTRACT_FILE, read_contract
from vlgrpo.evals.report import write_outputs
from vlgrpo.evals.run import EvalResult, build_eval_data, evaluate
from vlgrpo.registry import ENGINE
from vlgrpo.rewards.context import RewardContext
from vlgrpo.types import InputError


def load_for_eval(model: str, workdir: Path, dtype: str = "float32", device: str = "cpu"):
    """(LoadedModel, the run's Config or None, the prompt contract or None) from an HF checkpoint directory
    (config.json; an export also holds vlgrpo.json, the prompt contract), a run directory (config.yaml +
    checkpoints/: its newest checkpoint is exported to `workdir` first, LoRA merged) or a hub id."""
    from vlgrpo.models import load_model

    path = Path(model)
    if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
        from vlgrpo.config import load_config
        from vlgrpo.trainer.export import export_run

        cfg = load_config(path / "config.yaml")
        exported = export_run(path, workdir / "export")
        return load_model(str(exported), cfg.model.arch, dtype, device=device), cfg, read_contract(exported)
    if path.is_dir() and not (path / "config.json").is_file():
        raise InputError(
            f"--model '{model}' is neither an HF checkpoint directory (config.json) nor a run "
            "directory (config.yaml + checkpoints/)"
        )
    contract = read_contract(path) if path.is_dir() else None
    pixels = {"min_pixels": contract.min_pixels, "max_pixels": contract.max_pixels} if contract else {}
    arch = contract.arch if contract else "auto"
    return load_model(model, arch, dtype=dtype, device=device, **pixels), None, contract


DEFAULT_MAX_NEW_TOKENS = 128
"""New tokens per completion for a checkpoint that does not say what it was trained with (a hub id)."""


def _trained_max_new_tokens(run_cfg, contract) -> int:
    if run_cfg is not None:
        return run_cfg.rollout.max_new_tokens
    if contract is not None and contract.max_new_tokens:
        return contract.max_new_tokens
    return DEFAULT_MAX_NEW_TOKENS


def run_eval_cli(
    model: str,
    suites: str,
    data: str | None,
    out: str | Path,
    *,
    max_samples: int | None = None,
    pope_parser: str = "pope",
    answer_format: str | None = None,
    box_format: str | None = None,
    max_new_tokens: int | None = None,
    batch_prompts: int = 8,
    pope_data: str | None = None,
    pope_splits: tuple[str, ...] | None = None,
    pope_images: int | None = None,
    pope_per_image: int = 3,
    pope_min_objects: int = 3,
    dtype: str = "float32",
    device: str | None = None,
    cache_dir: str | None = None,
    progress: bool = True,
    engine: str = "hf",
    engine_kwargs: dict | None = None,
    gpu_memory_utilization: float = 0.8,
    split: str | None = None,
    judge: str | None = None,
    tools: tuple[str, ...] = (),
    max_turns: int = 5,
) -> EvalResult:
    """Load the model, pick the suites' samples, evaluate, write metrics.json / predictions.jsonl / report.md.

    A run directory also supplies the defaults of answer format, system prompt, box convention, tolerances and data
    (data.test, else data.val); an exported checkpoint's vlgrpo.json those of answer format, system prompt, box
    convention and pixel bounds; otherwise the answer format is think_answer and boxes follow the model family.
    `max_new_tokens` defaults to the run's rollout.max_new_tokens (a run directory), else the contract's, else
    DEFAULT_MAX_NEW_TOKENS: a checkpoint trained to reason in 512 tokens is not scored on 128.
    More than half of the completions without an answer to read is reported loudly (the prompt probably differs
    from training).
    engine: hf (transformers) or vllm (greedy decoding through vLLM, with our cached image features: the same
    predictions, faster on a GPU; `engine_kwargs` go to `vllm.LLM`).
    judge: also score the answers with a judge model: "" for the run directory's own reward.judge, or a config
    file holding a reward.judge section (`evals/judged.py`).
    tools: the tools the model may call (`rollout/tools.py`, e.g. ("zoom_in",)), up to `max_turns` turns a sample
    (`rollout/turns.py`; the hf engine); each multi-turn row's conversation goes to predictions.jsonl, its crops
    next to it."""

    from vlgrpo.data.images import ProcessorGeometry
    from vlgrpo.rewards import box_format_for_arch, context_from_config
    from vlgrpo.vision_cache import VisionCache

    if tools and engine != "hf":
        raise InputError(f"--tools runs on --engine hf for now (got {engine}): vLLM's multi-turn comes later")
    if tools:
        from vlgrpo.rollout.tools import tool_table

        tool_table(tuple(tools))  # an unknown tool or a user function that cannot load: before the model loads
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory(prefix="vlgrpo-eval-") as tmp:
        lm, run_cfg, contract = load_for_eval(model, Path(tmp), dtype, device)
        geometry = ProcessorGeometry.from_processor(lm.processor)
        if run_cfg is not None:
            ctx = context_from_config(run_cfg, lm.arch, geometry)
            data = data or run_cfg.data.test or run_cfg.data.val
        elif contract is not None:  # how the checkpoint was trained to answer
            ctx = RewardContext(box_format=contract.box_format, answer_format=contract.answer_format, geometry=geometry)
        else:
            ctx = RewardContext(box_format=box_format_for_arch(lm.arch), geometry=geometry)
        max_new_tokens = max_new_tokens or _trained_max_new_tokens(run_cfg, contract)
        ctx = dataclasses.replace(
            ctx, box_format=box_format or ctx.box_format, answer_format=answer_format or ctx.answer_format
        )
        if judge is not None:
            ctx = dataclasses.replace(ctx, judge=_judge(judge, run_cfg))
        eval_data = build_eval_data(
            data,
            suites,
            max_samples=max_samples,
            pope_data=pope_data,
            pope_splits=pope_splits,
            pope_images=pope_images,
            pope_per_image=pope_per_image,
            pope_min_objects=pope_min_objects,
            ctx=ctx,
            split=split,
            **({"preset": run_cfg.data.preset, "columns": dict(run_cfg.data.columns)} if run_cfg is not None else {}),
        )
        cache = VisionCache(lm.model, lm.processor, disk_dir=cache_dir)
        system_prompt = (
            run_cfg.data.system_prompt if run_cfg is not None else contract.system_prompt if contract else ""
        )
        prompt_kw = dict(
            answer_format=ctx.answer_format,
            box_format=ctx.box_format,
            system_prompt=system_prompt,
            video_sampling=_video_sampling(run_cfg, contract),
            thinking=run_cfg.data.thinking if run_cfg is not None else contract.thinking if contract else "auto",
        )
        if engine not in ENGINE.names:
            raise InputError(f"--engine must be one of {', '.join(ENGINE.names)}, got {engine!r}")
        decoder = ENGINE.load(engine).for_eval(
            lm,
            cache,
            dtype=dtype,
            batch_prompts=batch_prompts,
            engine_kwargs=engine_kwargs or {},
            gpu_memory_utilization=gpu_memory_utilization,
            max_turns=max_turns if tools else 1,
            **prompt_kw,
        )
        if tools:
            from vlgrpo.rollout.turns import ToolRollout

            decoder = ToolRollout(decoder, tuple(tools), max_turns)
        result = evaluate(
            decoder,
            eval_data,
            ctx,
            pope_parser=pope_parser,
            batch_prompts=batch_prompts,
            max_new_tokens=max_new_tokens,
            progress=progress,
            judge=judge is not None,
        )
    result.info.update(
        model=str(model),
        data=str(data),
        pope_data=pope_data,
        answer_format=ctx.answer_format,
        arch=lm.arch,
        engine=engine,
        prompt_contract=CONTRACT_FILE if contract else None,
        video=dataclasses.asdict(prompt_kw["video_sampling"]),
        vision_cache={k: int(v) for k, v in cache.stats().items()},
    )
    if tools:
        result.info["tools"] = {
            "tools": list(tools),
            "max_turns": max_turns,
            **{k: v for k, v in decoder.stats().items() if k.startswith("tools/")},
        }
    write_outputs(result, out)
    if result.info.get("warning"):
        print(f"[vlgrpo] WARNING: {result.info['warning']}", file=sys.stderr)
    return result


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


def _video_sampling(run_cfg, contract):
    """The video settings a checkpoint was trained with: its run's data.video, else its contract's, else defaults."""
    from vlgrpo.data.video import VideoSampling

    if run_cfg is not None:
        return VideoSampling.from_config(run_cfg.data.video)
    if contract is not None and contract.video is not None:
        v = contract.video
        return VideoSampling(
            float(v["fps"]), int(v["max_frames"]), int(v["min_pixels"] or 0), int(v["max_pixels"] or 0)
        )
    return VideoSampling()
