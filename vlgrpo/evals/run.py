"""The eval runner shared by `vlgrpo eval --model` (evals/offline.py) and the trainer's in-loop eval: pick each
suite's samples, decode them greedily through a rollout engine (batched, cached vision features), score each suite,
write metrics.json, predictions.jsonl and report.md.

Knows suites only through `evals/suite.py` (each suite's own module selects, scores and reports), the engine only
through its protocol; knows nothing of losses, optimisers or checkpoint formats.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable

import torch

from vlgrpo.evals.pope_score import PARSERS
from vlgrpo.evals.pope_suite import is_pope_file
from vlgrpo.evals.report import write_outputs
from vlgrpo.evals.suite import EvalData, EvalResult, Selection, load_suite, parse_suites
from vlgrpo.models import eval_mode
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.types import Completion, InputError, Sample

__all__ = ["EvalData", "EvalResult", "build_eval_data", "evaluate", "make_evaluator", "write_outputs"]


# ---------------------------------------------------------------- choosing the samples


def build_eval_data(
    data: str | Path | None, suites: str | list[str], *, max_samples: int | None = None,
    pope_data: str | Path | None = None, pope_splits: tuple[str, ...] | None = None, pope_images: int | None = None,
    pope_per_image: int = 3, pope_min_objects: int = 3, ctx: RewardContext | None = None, preset: str = "none",
    columns: dict[str, str] | None = None,
) -> EvalData:  # fmt: skip
    """Each suite's samples from one dataset (`load_samples`), chosen by the suite (`Suite.select`): vqa = the
    number/choice/yesno/text/math samples, grounding = the box samples, pope = probes built from the samples'
    objects (split `random` unless `pope_splits`; from `pope_images` images, default all eligible, then whole
    images up to `max_samples` questions per split, so a small cap still has the whole dataset's objects to pick
    negatives from). `pope_data`, or `data` itself when it is a POPE question file, supplies POPE instead (every
    split in it unless `pope_splits`). max_samples caps every suite (the first N). With `ctx`, VQA gold answers are
    checked before any decoding."""
    from vlgrpo.data.adapters import load_samples

    names = parse_suites(suites)
    if data is None and pope_data is None:
        raise InputError("no eval data: pass --data (a Sample dataset or a POPE question file) or set eval.data")
    pope_file = pope_data if pope_data is not None else (data if is_pope_file(data) else None)
    samples = [] if data is None or pope_file == data else load_samples(data, preset=preset, columns=columns).samples
    sel = Selection(data, samples, max_samples, pope_file, pope_splits, pope_images, pope_per_image, pope_min_objects,
                    ctx)  # fmt: skip
    out = {}
    for name in names:
        suite = load_suite(name)
        out[name] = suite.select(sel)
        if not out[name]:
            raise InputError(f"eval suite '{name}' has nothing to run on in '{data}': it needs {suite.needs}")
    return EvalData(**out)


# ---------------------------------------------------------------- decoding and scoring


def _generate(engine, samples: list[Sample], batch_prompts: int, max_new_tokens: int, progress: bool):
    """One greedy completion per sample, `batch_prompts` prompts per engine call."""
    from tqdm import tqdm

    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens)
    out: list[Completion] = []
    with torch.no_grad(), tqdm(total=len(samples), desc="eval", unit="sample", disable=not progress) as bar:
        for i in range(0, len(samples), batch_prompts):
            groups = engine.generate(samples[i : i + batch_prompts], params)
            out += [g.completions[0] for g in groups]
            bar.update(len(groups))
    return out


def evaluate(
    engine, data: EvalData, reward_ctx: RewardContext, *, pope_parser: str = "pope", batch_prompts: int = 8,
    max_new_tokens: int = 64, progress: bool = True,
) -> EvalResult:  # fmt: skip
    """Greedy-decode every suite's samples through `engine` (any RolloutEngine) and score them.

    Suites are decoded back to back in one stream of `batch_prompts`-sized calls, so an image shared by several
    questions (POPE asks six about each) is encoded once by the engine's vision cache."""
    if pope_parser not in PARSERS:
        raise InputError(f"POPE parser {pope_parser!r} is not accepted; use one of {', '.join(PARSERS)}")
    if batch_prompts < 1:
        raise InputError(f"eval batch_prompts must be >= 1, got {batch_prompts}")
    suites = data.suites()
    if not suites:
        raise InputError("nothing to evaluate: every eval suite is empty")
    t0 = time.perf_counter()
    samples = [s for group in suites.values() for s in group]
    completions = _generate(engine, samples, batch_prompts, max_new_tokens, progress)
    result = EvalResult(metrics={}, predictions=[])
    start = 0
    for name, group in suites.items():
        scorer = load_suite(name).score
        metrics, counts, rows = scorer(group, completions[start : start + len(group)], reward_ctx, pope_parser)
        start += len(group)
        result.metrics.update({f"eval/{name}/{k}": v for k, v in metrics.items()})
        result.counts.update({f"{name}/{k}" if k else name: v for k, v in counts.items()})
        result.predictions += rows
    result.info = {"suites": list(suites), "samples": len(samples), "decoding": "greedy",
                   "max_new_tokens": max_new_tokens, "pope_parser": pope_parser, "box_format": reward_ctx.box_format,
                   "answer_format": reward_ctx.answer_format,
                   "no_answer": sum(not row["answered"] for row in result.predictions),
                   "seconds": round(time.perf_counter() - t0, 3)}  # fmt: skip
    warning = no_answer_warning(result)
    if warning:  # report.md and metrics.json carry it too
        result.info["warning"] = warning
    return result


def no_answer_warning(result: EvalResult) -> str | None:
    """A warning when more than half of the completions hold no answer to read: then the metrics measure the
    prompt, not the model (a checkpoint trained with one answer format, evaluated with another)."""
    n, missing = result.info.get("samples", 0), result.info.get("no_answer", 0)
    if not n or missing * 2 <= n:
        return None
    return (f"{missing} of {n} completions ({missing / n:.0%}) hold no answer that can be read, so these metrics "
            f"measure the prompt more than the model. They were prompted with answer_format="
            f"{result.info.get('answer_format')!r} and box_format={result.info.get('box_format')!r}: if the "
            "checkpoint was trained otherwise, pass --answer-format / --box-format, or evaluate its run directory or "
            "an export that holds vlgrpo.json. See predictions.jsonl for what it wrote.")


# ---------------------------------------------------------------- in-loop eval (the trainer's hook)


@contextlib.contextmanager
def _undisturbed(model: torch.nn.Module):
    """No gradients, eval mode; the model's mode and the torch RNG streams (CPU, CUDA) restored afterwards."""
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        with eval_mode(model), torch.no_grad():
            yield
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def make_evaluator(cfg) -> Callable[[Any], dict[str, float]]:
    """The trainer's hook: `evaluator(state) -> {"eval/<suite>/<metric>": value}` on the *training* model.

    Loads `eval.data` (else `data.val`) on the first call; decodes through an HFEngine over `state.backend.model`
    with the run's vision cache, processor, box convention and answer format, `eval.max_samples` per suite,
    `rollout.max_new_tokens` new tokens. Greedy decoding draws no random numbers; the torch RNG state and the
    model's mode are restored anyway, so a run with in-loop eval trains exactly as one without."""
    source = cfg.eval.data or cfg.data.val
    if not source:
        from vlgrpo.config import ConfigError

        raise ConfigError("eval.every_steps > 0 needs an eval dataset: set eval.data or data.val")
    held: dict[str, Any] = {}

    def evaluator(state) -> dict[str, float]:
        from vlgrpo.rollout.hf import HFEngine

        e = cfg.eval
        if "data" not in held:
            held["data"] = build_eval_data(source, e.suites, max_samples=e.max_samples, ctx=state.reward_ctx,
                                           preset=cfg.data.preset, columns=dict(cfg.data.columns))  # fmt: skip
        model = state.backend.model
        if held.get("model") is not model:
            held["engine"] = HFEngine(model, state.lm.processor, state.cache, cfg.data.answer_format,
                                      state.reward_ctx.box_format, cfg.data.system_prompt, e.batch_prompts)  # fmt: skip
            held["model"] = model
        with _undisturbed(model):
            result = evaluate(held["engine"], held["data"], state.reward_ctx, pope_parser=e.pope_parser,
                              batch_prompts=e.batch_prompts, max_new_tokens=cfg.rollout.max_new_tokens,
                              progress=False)  # fmt: skip
        return result.metrics

    return evaluator
