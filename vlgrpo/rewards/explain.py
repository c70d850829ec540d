"""Debugging one completion against one sample: read the `vlgrpo reward` arguments, score, lay out the report.

Backs `vlgrpo reward`; the report shows what the parsers saw (extracted answer, format verdict, whether the answer
parses for the answer type, boxes in original pixels) next to each component and the weighted total. Knows
nothing of models or the training loop.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from vlgrpo.rewards.compose import DEFAULT_RECIPES, check_recipe, default_recipe, score
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.parsed import Parsed
from vlgrpo.rewards.registry import RewardError, predicted_boxes
from vlgrpo.types import InputError, Sample


def load_sample(arg: str, index: int = 0, sample_id: str | None = None) -> Sample:
    """The sample a `--sample` argument names: a JSON row, or row `index` (or id `sample_id`) of a JSONL file.
    The original image size is read from the image file when the row does not carry it."""
    from vlgrpo.data.adapters import load_samples
    from vlgrpo.data.schema import sample_from_dict

    if arg.lstrip().startswith("{"):
        try:
            sample = sample_from_dict(json.loads(arg), "--sample", None, Path.cwd())
        except json.JSONDecodeError as e:
            raise InputError(f"--sample is not valid JSON ({e.msg} at column {e.colno})") from None
    else:
        samples = load_samples(arg, format="jsonl").samples
        if sample_id is not None:
            found = [s for s in samples if s.id == sample_id]
            if not found:
                raise InputError(f"--id {sample_id!r}: no sample with that id in {arg}")
            sample = found[0]
        elif not 0 <= index < len(samples):
            raise InputError(f"--index {index} is out of range: {arg} holds {len(samples)} samples")
        else:
            sample = samples[index]
    if sample.image_size is None and isinstance(sample.image, str) and Path(sample.image).is_file():
        from vlgrpo.data.images import image_size

        sample.image_size = image_size(sample.image)
    return sample


def read_completion(arg: str) -> str:
    """`--completion`: the text itself, '-' for stdin, or '@path' for a file."""
    if arg == "-":
        return sys.stdin.read()
    if arg.startswith("@"):
        path = Path(arg[1:])
        if not path.is_file():
            raise InputError(f"--completion {arg}: file '{path}' does not exist")
        return path.read_text()
    return arg


def read_recipe(arg: str | None, answer_type: str) -> tuple[dict[str, float], Any]:
    """The recipe a `--recipe` argument names, and the Config when the argument was a run config file.

    Accepted: nothing (the default recipe of the sample's answer type); an answer type ("box"); one reward name
    ("iou@0.75", "my_mod:fn", weight 1); an inline mapping ("{accuracy: 1, format: 0.2}"); a YAML/JSON file holding
    such a mapping, or a full run config (its reward.recipe and reward settings are used).
    """
    if arg is None:
        return default_recipe(answer_type), None
    path = Path(arg)
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        data = yaml.safe_load(path.read_text()) or {}
        if isinstance(data, dict) and ("reward" in data or any(isinstance(v, dict) for v in data.values())):
            from vlgrpo.config import load_config

            cfg = load_config(path)
            return dict(cfg.reward.recipe), cfg
        return _mapping(data, f"recipe file '{path}'"), None
    if arg.lstrip().startswith("{"):
        try:
            data = yaml.safe_load(arg)
        except yaml.YAMLError as e:
            raise RewardError(f"--recipe {arg!r} is not a valid YAML mapping ({e})") from None
        return _mapping(data, f"--recipe {arg!r}"), None
    if arg in DEFAULT_RECIPES:
        return default_recipe(arg), None
    return {arg: 1.0}, None


def _mapping(data: Any, where: str) -> dict[str, float]:
    if not isinstance(data, dict) or not data:
        raise RewardError(f"{where} must be a non-empty mapping of reward name -> weight, e.g. {{accuracy: 1.0}}")
    recipe = {str(k): v for k, v in data.items()}
    check_recipe(recipe)
    return recipe


def explain(completion: str, sample: Sample, recipe: dict[str, float], ctx: RewardContext) -> dict[str, Any]:
    """Score one completion and return everything needed to see why it earned what it earned."""
    batch = score([completion], [sample], recipe, ctx, judge_check=False)
    view = Parsed(completion, ctx)
    report: dict[str, Any] = {
        "sample_id": sample.id,
        "answer_type": sample.answer_type,
        "gold": sample.answer,
        "extracted_answer": view.answer,
        "answer_format": ctx.answer_format,
        "format_ok": view.format_ok,
    }
    try:  # what the format reward asks of the content (reward.format_requires_answer)
        report["answer_parses"] = view.typed_answer(sample.answer_type) is not None
    except ValueError as e:
        report["answer_parses"] = f"error: {e}"
    if sample.answer_type == "box":
        report["box_format"] = ctx.box_format
        report["gold_boxes"] = [list(b) for b in sample.boxes]
        try:
            report["predicted_boxes"] = [[round(v, 2) for v in b] for b in predicted_boxes(completion, sample, ctx)]
        except ValueError as e:
            report["predicted_boxes"] = f"error: {e}"
    report["components"] = {name: values[0] for name, values in batch.components.items()}
    report["weights"] = dict(recipe)
    report["total"] = batch.total[0]
    report["failures"] = [{"component": name, "error": err} for _, name, err in batch.failures]
    if batch.verdicts:  # what the judge was asked and what it said
        v = batch.verdicts[0]
        report["judge"] = {
            "endpoint": ctx.judge.url,
            "prompt": ctx.judge.prompt(completion, sample, ctx.answer_fallback),
            "reply": v.reply,
            "score": v.score,
            "error": v.error,
            "latency_s": round(v.latency_s, 3),
            "attempts": v.attempts,
        }
    return report


def format_report(report: dict[str, Any]) -> str:
    """Human-readable layout of `explain`'s report."""
    gold = report["gold_boxes"] if report["answer_type"] == "box" else repr(report["gold"])
    lines = [
        f"sample {report['sample_id']} ({report['answer_type']}), gold: {gold}",
        f"extracted answer: {report['extracted_answer']!r}",
        f"format ({report['answer_format']}): {'ok' if report['format_ok'] else 'FAILED'}; the answer "
        f"{'parses' if report['answer_parses'] is True else 'does not parse'} as {report['answer_type']}",
    ]
    if "predicted_boxes" in report:
        lines.append(f"predicted boxes ({report['box_format']} -> original px): {report['predicted_boxes']}")
    width = max(len("component"), *(len(n) for n in report["components"]))
    lines.append(f"{'component':<{width}}  {'value':>8}  {'weight':>7}  {'weighted':>8}")
    for name, value in report["components"].items():
        w = report["weights"][name]
        lines.append(f"{name:<{width}}  {value:>8.4f}  {w:>7.3g}  {w * value:>8.4f}")
    lines.append(f"{'total':<{width}}  {'':>8}  {'':>7}  {report['total']:>8.4f}")
    if "judge" in report:
        j = report["judge"]
        lines.append(f"judge {j['endpoint']} ({j['attempts']} attempt(s), {j['latency_s']} s), asked:")
        lines += ["  " + line for line in j["prompt"].splitlines()]
        lines.append(
            f"judge reply: {j['reply']!r} -> score {j['score']:g}" + (f" ({j['error']})" if j["error"] else "")
        )
    for f in report["failures"]:
        lines.append(f"FAILED {f['component']}: {f['error']} (scored 0)")
    return "\n".join(lines)
