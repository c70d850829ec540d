"""`vlgrpo eval --model PATH_OR_RUN`: load a checkpoint (or export a run's newest checkpoint), resolve the request
against the run and the checkpoint (`evals/request.py`), build the decoder (transformers or vLLM, with tools), run the
suites through `evals.run.evaluate` and write the outputs.

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
from vlgrpo.evals.request import EvalRequest, resolve
from vlgrpo.evals.run import EvalResult, build_eval_data, evaluate
from vlgrpo.registry import ENGINE
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


def run_eval(request: EvalRequest) -> EvalResult:
    """Load the model, resolve the request (`evals/request.py`: flag > run > contract > default), pick the suites'
    samples, evaluate, write metrics.json / predictions.jsonl / report.md.

    More than half of the completions without an answer to read is reported loudly (the prompt probably differs
    from training). The engine is built as every engine is (`rollout.build.build_engine`): hf (transformers) or vllm
    (greedy decoding through vLLM with our cached image features: the same predictions, faster on a GPU), with the
    tools the run trained with or --tools named, each multi-turn row's conversation in predictions.jsonl and its
    crops next to it."""
    from vlgrpo.rollout.build import build_engine
    from vlgrpo.vision_cache import VisionCache

    e = request.engine
    if e.kind not in ENGINE.names:
        raise InputError(f"--engine must be one of {', '.join(ENGINE.names)}, got {e.kind!r}")
    device = e.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory(prefix="vlgrpo-eval-") as tmp:
        lm, run_cfg, contract = load_for_eval(request.model, Path(tmp), e.dtype, device)
        r = resolve(request, run_cfg, contract, lm.processor, lm.arch)
        eval_data = build_eval_data(
            r.source, request.suites, max_samples=request.max_samples, pope=request.pope, ctx=r.ctx
        )
        cache = VisionCache(lm.model, lm.processor, disk_dir=e.cache_dir)
        launch = dict(dtype=e.dtype, engine_kwargs=e.engine_kwargs, gpu_memory_utilization=e.gpu_memory_utilization)
        decoder = build_engine(e.kind, lm, cache, r.prompt, batch_prompts=e.batch_prompts, **launch)
        result = evaluate(
            decoder,
            eval_data,
            r.ctx,
            pope_parser=request.pope.parser,
            batch_prompts=e.batch_prompts,
            max_new_tokens=r.max_new_tokens,
            progress=request.progress,
            judge=request.judge is not None,
        )
    result.info.update(
        model=str(request.model),
        data=str(r.source.path),
        source=r.source.describe(),
        pope_data=request.pope.data,
        answer_format=r.ctx.answer_format,
        arch=lm.arch,
        engine=e.kind,
        thinking=r.prompt.thinking,
        prompt_contract=CONTRACT_FILE if contract else None,
        video=dataclasses.asdict(r.prompt.video_sampling),
        vision_cache={k: int(v) for k, v in cache.stats().items()},
    )
    if r.prompt.tools:
        tools = {k: v for k, v in decoder.stats().items() if k.startswith("tools/")}
        result.info["tools"] = {"tools": list(r.prompt.tools), "max_turns": r.prompt.max_turns, **tools}
    write_outputs(result, request.out)
    if result.info.get("warning"):
        print(f"[vlgrpo] WARNING: {result.info['warning']}", file=sys.stderr)
    return result
