"""The eval runner shared by `vlgrpo eval --model` (evals/offline.py) and the trainer's in-loop eval: pick each
suite's samples, decode them greedily through a rollout engine (batched, cached vision features), score POPE /
grounding / VQA, write metrics.json, predictions.jsonl and report.md.

Only sees the engine protocol and the rewards context; knows nothing of losses, optimisers or checkpoint formats.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from vlgrpo.config import EVAL_SUITES
from vlgrpo.evals.benchmarks import load_pope
from vlgrpo.evals.grounding import box_iou, grounding_metrics
from vlgrpo.evals.pope_build import build_pope, objects_from_samples, read_json_rows
from vlgrpo.evals.pope_score import PARSERS, RATES, Prediction, parse_answer, score_predictions
from vlgrpo.evals.report import write_outputs
from vlgrpo.evals.vqa import VQA_TYPES, check_gold, judge, ungated, vqa_metrics
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.types import Completion, InputError, Sample

__all__ = ["EvalData", "EvalResult", "build_eval_data", "evaluate", "make_evaluator", "write_outputs"]

POPE_SEED = 0
"""Probes built from a dataset use a fixed seed: every checkpoint of a run is asked the same questions."""


@dataclass
class EvalData:
    """The samples each suite is run on (an empty list: the suite is not run). POPE samples are yes/no questions
    with task `pope/<split>` and meta `split` / `question_id`."""

    vqa: list[Sample] = field(default_factory=list)
    grounding: list[Sample] = field(default_factory=list)
    pope: list[Sample] = field(default_factory=list)

    def suites(self) -> dict[str, list[Sample]]:
        return {name: getattr(self, name) for name in EVAL_SUITES if getattr(self, name)}


@dataclass
class EvalResult:
    metrics: dict[str, float]
    """`eval/<suite>/<metric>`, every value in [0, 1]."""
    predictions: list[dict]
    """One row per evaluated sample: id, suite, task, question, gold, completion, and correct / iou."""
    counts: dict[str, int] = field(default_factory=dict)
    """Samples behind the metrics: "<suite>" and "<suite>/<group>" (answer type, task_<task>, POPE split)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Settings and timing of the run (decoding, parser, seconds, and what the caller adds)."""


# ---------------------------------------------------------------- choosing the samples


def parse_suites(suites: str | list[str] | tuple[str, ...]) -> list[str]:
    names = [s.strip() for s in suites.split(",")] if isinstance(suites, str) else list(suites)
    bad = [s for s in names if s not in EVAL_SUITES]
    if bad or not names:
        raise InputError(f"eval suites {bad or names} are not accepted; use a comma list of {', '.join(EVAL_SUITES)}")
    return names


def is_pope_file(path: str | Path) -> bool:
    """A JSON/JSONL file of POPE questions (rows with `text` and `label`, no Sample `question`)."""
    p = Path(path)
    if not (p.is_file() and p.suffix in (".json", ".jsonl")):
        return False
    with p.open(encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), "")
    row = read_json_rows(p)[0][1] if first.lstrip().startswith("[") else _json_or_none(first)
    return isinstance(row, dict) and "label" in row and "text" in row and "question" not in row


def _json_or_none(line: str) -> Any:
    with contextlib.suppress(json.JSONDecodeError):
        return json.loads(line)
    return None


def pope_from_samples(
    samples: list[Sample], splits: tuple[str, ...] = ("random",), n_images: int | None = None, per_image: int = 3,
    min_objects: int = 3, seed: int = POPE_SEED,
) -> list[Sample]:  # fmt: skip
    """POPE questions built by the POPE builder from the samples' `objects`, as yes/no Samples (id
    `pope-<split>-<question_id>`, task `pope/<split>`, as `load_pope` names them) from n_images of the eligible
    images (None or 0: all of them)."""
    images = objects_from_samples(samples)
    eligible = sum(len(im.objects) >= min_objects for im in images)
    if eligible == 0:
        raise InputError(
            f"POPE: none of the {len(images)} images has >= {min_objects} distinct objects (Sample.objects) to ask "
            "about; lower the POPE min-objects / per-image, or give a POPE question file"
        )
    n = min(n_images, eligible) if n_images else eligible
    pope = build_pope(images, n, per_image, min_objects, seed, splits=tuple(splits))
    sizes = {str(Path(s.image).resolve()): s.image_size for s in samples}
    return [
        Sample(id=f"pope-{split}-{row['question_id']}", question=row["text"], answer=row["label"],
               answer_type="yesno", image=row["image"], image_size=sizes.get(row["image"]), task=f"pope/{split}",
               meta={k: row[k] for k in ("question_id", "split", "object", "sample_id") if k in row})
        for split, rows in pope.questions.items() for row in rows
    ]  # fmt: skip


def pope_from_file(path: str | Path, splits: tuple[str, ...] | None, max_per_split: int | None) -> list[Sample]:
    """POPE questions of a question file / saved dataset (`load_pope`), the first `max_per_split` of each split
    (the official files alternate yes/no, so an even cap keeps them balanced)."""
    out = [s for s in load_pope(path) if splits is None or s.meta["split"] in splits]
    if not out:
        raise InputError(f"POPE file '{path}' has no questions of split(s) {list(splits or [])}")
    return _cap_per_split(out, max_per_split)


def _cap_per_split(samples: list[Sample], cap: int | None) -> list[Sample]:
    """The first `cap` POPE questions of each split (all when cap is None)."""
    taken: dict[str, int] = {}
    out = []
    for s in samples:
        taken[s.meta["split"]] = taken.get(s.meta["split"], 0) + 1
        if cap is None or taken[s.meta["split"]] <= cap:
            out.append(s)
    return out


def _with_sizes(samples: list[Sample]) -> list[Sample]:
    """Box samples get their original (width, height) from the image header when the dataset left it out."""
    from vlgrpo.data.images import image_size

    for s in samples:
        if s.image_size is None:
            s.image_size = image_size(s.image)
    return samples


def build_eval_data(
    data: str | Path | None, suites: str | list[str], *, max_samples: int | None = None,
    pope_data: str | Path | None = None, pope_splits: tuple[str, ...] | None = None, pope_images: int | None = None,
    pope_per_image: int = 3, pope_min_objects: int = 3, ctx: RewardContext | None = None, preset: str = "none",
    columns: dict[str, str] | None = None,
) -> EvalData:  # fmt: skip
    """Each suite's samples from one dataset (`load_samples`): vqa = number/choice/yesno/text/math samples,
    grounding = box samples, pope = probes built from the samples' objects (split `random` unless `pope_splits`;
    from `pope_images` images, default all eligible, then whole images up to `max_samples` questions per split,
    so a small cap still has the whole dataset's objects to pick negatives from). `pope_data`, or `data`
    itself when it is a POPE question file, supplies POPE instead (every split in it unless `pope_splits`).
    max_samples caps every suite (the first N). With `ctx`, VQA gold answers are checked before any decoding."""
    from vlgrpo.data.adapters import load_samples

    names = parse_suites(suites)
    if data is None and pope_data is None:
        raise InputError("no eval data: pass --data (a Sample dataset or a POPE question file) or set eval.data")
    pope_file = pope_data if pope_data is not None else (data if is_pope_file(data) else None)
    samples = [] if data is None or pope_file == data else load_samples(data, preset=preset, columns=columns).samples
    cap = slice(None, max_samples)
    out = EvalData()
    if "vqa" in names:
        out.vqa = [s for s in samples if s.answer_type in VQA_TYPES][cap]
    if "grounding" in names:
        out.grounding = _with_sizes([s for s in samples if s.answer_type == "box"][cap])
    if "pope" in names and pope_file is not None:
        out.pope = pope_from_file(pope_file, pope_splits, max_samples)
    elif "pope" in names:  # built over every eligible image (as many negatives as the data has), then capped
        pope = pope_from_samples(samples, pope_splits or ("random",), pope_images, pope_per_image, pope_min_objects)
        per_image = 2 * pope_per_image  # questions of one image stay together: whole images are kept
        out.pope = _cap_per_split(pope, math.ceil(max_samples / per_image) * per_image if max_samples else None)
    need = {"vqa": f"samples of answer_type {'/'.join(VQA_TYPES)}", "grounding": "samples of answer_type box",
            "pope": "objects lists or POPE questions"}  # fmt: skip
    for name in names:
        if not getattr(out, name):
            raise InputError(f"eval suite '{name}' has nothing to run on in '{data}': it needs {need[name]}")
    if ctx is not None and out.vqa:
        check_gold(out.vqa, ctx, str(data))
    return out


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


def _row(suite: str, s: Sample, c: Completion, gold: Any) -> dict:
    return {"id": s.id, "suite": suite, "task": s.task, "question": s.question, "gold": gold,
            "completion": c.text, "finish_reason": c.finish_reason}  # fmt: skip


def _score_vqa(samples, completions, ctx: RewardContext, parser: str):
    ctx = ungated(ctx)
    verdicts = [judge(c.text, s, ctx) for s, c in zip(samples, completions)]
    metrics, counts = vqa_metrics(samples, [ok for ok, _ in verdicts])
    rows = [{**_row("vqa", s, c, s.answer), "answer_type": s.answer_type, "extracted": read, "correct": ok}
            for s, c, (ok, read) in zip(samples, completions, verdicts)]  # fmt: skip
    return metrics, counts, rows


def _score_grounding(samples, completions, ctx: RewardContext, parser: str):
    scored = [box_iou(c.text, s, ctx) for s, c in zip(samples, completions)]
    ious, parsed = [v for v, _ in scored], [b is not None for _, b in scored]
    metrics, counts = grounding_metrics(ious, parsed, [s.task for s in samples])
    rows = [{**_row("grounding", s, c, s.boxes), "pred_box": list(b) if b else None, "iou": v}
            for s, c, (v, b) in zip(samples, completions, scored)]  # fmt: skip
    return metrics, counts, rows


def _pope_split(s: Sample) -> str:
    return str(s.meta.get("split") or (s.task[len("pope/") :] if s.task.startswith("pope/") else "all"))


def _score_pope(samples, completions, ctx: RewardContext, parser: str):
    """The POPE scorer per split; the suite's headline metrics are the means over splits (one split: its own)."""
    preds = [Prediction(str(s.meta.get("question_id", s.id)), c.text, s.answer, _pope_split(s))
             for s, c in zip(samples, completions)]  # fmt: skip
    splits = score_predictions(preds, parser)["splits"]
    per_split = {name: {**{k: m[k] for k in RATES}, "unknown": m["unknown"] / m["n"]} for name, m in splits.items()}
    metrics = {k: sum(m[k] for m in per_split.values()) / len(per_split) for k in (*RATES, "unknown")}
    if len(per_split) > 1:
        metrics.update({f"{name}/{k}": v for name, m in per_split.items() for k, v in m.items()})
    counts = {"": len(samples), **{name: m["n"] for name, m in splits.items()}}
    rows = []
    for s, c, p in zip(samples, completions, preds):
        parsed = parse_answer(c.text, parser)
        rows.append({**_row("pope", s, c, s.answer), "split": p.split, "question_id": s.meta.get("question_id"),
                     "parsed": parsed, "correct": parsed == s.answer})  # fmt: skip
    return metrics, counts, rows


SCORERS = {"vqa": _score_vqa, "grounding": _score_grounding, "pope": _score_pope}


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
        metrics, counts, rows = SCORERS[name](group, completions[start : start + len(group)], reward_ctx, pope_parser)
        start += len(group)
        result.metrics.update({f"eval/{name}/{k}": v for k, v in metrics.items()})
        result.counts.update({f"{name}/{k}" if k else name: v for k, v in counts.items()})
        result.predictions += rows
    result.info = {"suites": list(suites), "samples": len(samples), "decoding": "greedy",
                   "max_new_tokens": max_new_tokens, "pope_parser": pope_parser, "box_format": reward_ctx.box_format,
                   "seconds": round(time.perf_counter() - t0, 3)}  # fmt: skip
    return result


# ---------------------------------------------------------------- in-loop eval (the trainer's hook)


@contextlib.contextmanager
def _undisturbed(model: torch.nn.Module):
    """No gradients; the model's train/eval mode and the torch RNG streams (CPU, CUDA) restored afterwards."""
    was_training = model.training
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
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
