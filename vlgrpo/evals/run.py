"""The eval runner shared by `vlgrpo eval --model` (evals/offline.py) and the trainer's in-loop eval: pick each
suite's samples, decode them greedily through a rollout engine (batched, cached vision features), score each suite,
write metrics.json, predictions.jsonl and report.md.

Knows suites only through `evals/suite.py` (each suite's own module selects, scores and reports), the engine only
through its protocol; knows nothing of losses, optimisers or checkpoint formats.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vlgrpo import heartbeat
from vlgrpo.config import ConfigError
from vlgrpo.evals.judged import judge_suites
from vlgrpo.evals.pope.score import PARSERS
from vlgrpo.evals.report import write_outputs
from vlgrpo.evals.source import EvalSource, resolve_source
from vlgrpo.evals.suite import EvalData, EvalResult, PopeOptions, Selection, load_suite, parse_suites
from vlgrpo.evals.trajectories import add_trajectories
from vlgrpo.models import eval_mode
from vlgrpo.preflight import settings_from_config
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.types import Completion, InputError, Sample

__all__ = [
    "EvalData",
    "EvalResult",
    "build_eval_data",
    "evaluate",
    "in_loop_eval_data",
    "in_loop_eval_problem",
    "make_evaluator",
    "select_suites",
    "write_outputs",
]


# ---------------------------------------------------------------- choosing the samples


def build_eval_data(
    data: str | Path | EvalSource | None,
    suites: str | list[str],
    *,
    max_samples: int | None = None,
    pope: PopeOptions | None = None,
    ctx: RewardContext | None = None,
) -> EvalData:
    """Each suite's samples from one eval input (a path, resolved by `evals/source.py`, or its resolved value),
    chosen by the suite (`Suite.select`): vqa = the number/choice/yesno/text/math samples, grounding = the box
    samples, pope = probes built from the samples' objects (split `random` unless `pope.splits`; from `pope.images`
    images, default all eligible, then whole images up to `max_samples` questions per split, so a small cap still has
    the whole dataset's objects to pick negatives from), or read from `pope.data` or the data itself when it is a POPE
    question file (every split in it unless `pope.splits`); a benchmark suite its published file. max_samples caps
    every suite (the first N). With `ctx`, VQA gold answers are checked before any decoding. A suite with nothing to
    run on is an InputError naming every such suite."""
    names, pope = parse_suites(suites), pope or PopeOptions()
    if data is None and pope.data is None:
        raise InputError("no eval data: pass --data (a Sample dataset or a POPE question file) or set eval.data")
    source = data if isinstance(data, EvalSource) else resolve_source(data)
    sel = Selection(source, source.load(), max_samples=max_samples, pope=pope, ctx=ctx)
    selected, problems = select_suites(names, sel)
    if problems:
        where = source.path if source.path is not None else pope.data
        raise InputError("; ".join(f"eval suite '{name}' {why} (data '{where}')" for name, why in problems.items()))
    return EvalData(**selected)


def select_suites(names: list[str], sel: Selection) -> tuple[dict[str, list[Sample]], dict[str, str]]:
    """(samples by suite, why by suite): each suite's own `select`, and for each suite that cannot run, what it
    needs and why it has nothing (its selection is empty, or its `select` refused the data with an InputError,
    e.g. POPE finding no image with enough objects). The one place that decides whether a suite has data: the
    offline eval, the in-loop eval and the doctor all come through here."""
    selected, problems = {}, {}
    for name in names:
        suite = load_suite(name)
        try:
            selected[name] = suite.select(sel)
        except InputError as e:
            problems[name] = f"cannot run: {e} (it needs {suite.needs})"
            continue
        if not selected[name]:
            problems[name] = f"has nothing to run on: it needs {suite.needs}"
    return selected, problems


# ---------------------------------------------------------------- decoding and scoring


def _generate(engine, samples: list[Sample], batch_prompts: int, max_new_tokens: int, progress: bool):
    """One greedy completion per sample, `batch_prompts` prompts per engine call."""
    from tqdm import tqdm

    params = SamplingParams(completions_per_prompt=1, temperature=0.0, max_new_tokens=max_new_tokens)
    out: list[Completion] = []
    with torch.no_grad(), tqdm(total=len(samples), desc="eval", unit="sample", disable=not progress) as bar:
        for i in range(0, len(samples), batch_prompts):
            groups = engine.generate(samples[i : i + batch_prompts], params)
            out += [g.completions[0] for g in groups]
            bar.update(len(groups))
            heartbeat.beat(f"eval batch {i // batch_prompts + 1} ({len(out)}/{len(samples)} samples)")
    return out


def evaluate(
    engine,
    data: EvalData,
    reward_ctx: RewardContext,
    *,
    pope_parser: str = "pope",
    batch_prompts: int = 8,
    max_new_tokens: int = 64,
    progress: bool = True,
    judge: bool = False,
) -> EvalResult:
    """Greedy-decode every suite's samples through `engine` (any RolloutEngine) and score them; with `judge`, also
    by reward_ctx.judge (`evals/judged.py`).

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
    add_trajectories(result, suites, completions)
    if judge:
        judge_suites(result, suites, completions, reward_ctx)
    result.info = {
        **result.info,
        "suites": list(suites),
        "samples": len(samples),
        "decoding": "greedy",
        "max_new_tokens": max_new_tokens,
        "pope_parser": pope_parser,
        "box_format": reward_ctx.box_format,
        "answer_format": reward_ctx.answer_format,
        "no_answer": sum(not row["answered"] for row in result.predictions),
        "seconds": round(time.perf_counter() - t0, 3),
    }
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
    return (
        f"{missing} of {n} completions ({missing / n:.0%}) hold no answer that can be read, so these metrics "
        f"measure the prompt more than the model. They were prompted with answer_format="
        f"{result.info.get('answer_format')!r} and box_format={result.info.get('box_format')!r}: if the "
        "checkpoint was trained otherwise, pass --answer-format / --box-format, or evaluate its run directory or "
        "an export that holds vlgrpo.json. See predictions.jsonl for what it wrote."
    )


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


def in_loop_eval_data(cfg, ctx: RewardContext | None = None) -> EvalData:
    """The samples the in-loop eval runs on: `eval.data` (else `data.val`) read as training reads data (data.preset,
    data.columns), each of `eval.suites` selected by `select_suites` with `eval.max_samples` per suite and the POPE
    defaults of `build_eval_data` (random split, >= 3 distinct objects per image). With `ctx`, VQA gold answers are
    checked too. A ConfigError names every suite with nothing to run on, what it needs, and the fix: `vlgrpo train`
    refuses such a config before step 1 (not at the first eval, `eval.every_steps` steps in)."""
    e = cfg.eval
    key = "eval.data" if e.data else "data.val"
    source = e.data or cfg.data.val
    if not source:
        raise ConfigError("eval.every_steps > 0 needs an eval dataset: set eval.data or data.val")
    names = parse_suites(e.suites)
    resolved = resolve_source(source, preset=cfg.data.preset, columns=dict(cfg.data.columns))
    sel = Selection(resolved, resolved.load(), max_samples=e.max_samples, ctx=ctx)
    selected, problems = select_suites(names, sel)
    if problems:
        raise ConfigError(_refusal(names, problems, f"{key} '{source}'"))
    return EvalData(**selected)


def _refusal(names: list[str], problems: dict[str, str], where: str) -> str:
    """The in-loop eval's refusal: each suite without data, what it needs, and the two fixes."""
    kept = [n for n in names if n not in problems]
    drop = f"eval.suites=[{', '.join(kept)}]" if kept else "eval.every_steps=0: no in-loop eval"
    return (
        f"eval.suites [{', '.join(names)}] cannot all run on the in-loop eval data ({where}): "
        + "; ".join(f"'{name}' {why}" for name, why in problems.items())
        + f". Drop {' and '.join(repr(n) for n in problems)} from eval.suites ({drop}), or set eval.data to "
        "data that holds what they need"
    )


def in_loop_eval_problem(cfg) -> str | None:
    """What `vlgrpo train` would refuse about the in-loop eval's data (`in_loop_eval_data`), or None: also when
    eval.every_steps is 0. For the doctor, which checks gold answers itself (no reward context here)."""
    if not cfg.eval.every_steps:
        return None
    try:
        in_loop_eval_data(cfg)
    except InputError as e:
        return str(e)
    return None


def make_evaluator(cfg) -> Callable[[Any], dict[str, float]]:
    """The trainer's hook: `evaluator(state) -> {"eval/<suite>/<metric>": value}` on the *training* model.

    Selects its data now (`in_loop_eval_data`, gold answers checked with the run's reward context read from the
    config, no model loaded), so a suite without data stops `vlgrpo train` before step 1. Decodes through the HF
    engine over `state.backend.model` with the run's vision cache and processor, built as training's engine is (one
    PromptSettings: answer format, box convention, system prompt, thinking, video sampling; with rollout.tools the
    same multi-turn rollouts: `eval/tools/*`), `eval.max_samples` per suite, `rollout.max_new_tokens` new tokens.
    Greedy decoding draws no random numbers; the torch RNG state and the model's mode are restored anyway, so a run
    with in-loop eval trains exactly as one without."""
    data = in_loop_eval_data(cfg, settings_from_config(cfg)[1])
    held: dict[str, Any] = {}

    def evaluator(state) -> dict[str, float]:
        from vlgrpo.policy.prompt import PromptSettings
        from vlgrpo.rollout.build import build_engine

        e = cfg.eval
        model = state.backend.model
        if held.get("model") is not model:  # built as every engine is: the run's prompt settings, tools and turns
            prompt = PromptSettings.from_config(cfg, state.reward_ctx.box_format, state.lm.processor)
            held["engine"] = build_engine(
                "hf", state.lm, state.cache, prompt, model=model, batch_prompts=e.batch_prompts
            )
            held["model"] = model
        held["engine"].reset_stats()
        with _undisturbed(model):
            result = evaluate(
                held["engine"],
                data,
                state.reward_ctx,
                pope_parser=e.pope_parser,
                batch_prompts=e.batch_prompts,
                max_new_tokens=cfg.rollout.max_new_tokens,
                progress=False,
            )
        tools = {f"eval/{k}": v for k, v in held["engine"].stats().items() if k.startswith("tools/")}
        return {**result.metrics, **tools}

    return evaluator
