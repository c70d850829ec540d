"""The named rewards: a plain dict from name to `fn(completion, sample, ctx) -> float`, plus user functions.

Built-ins: accuracy (dispatch on answer_type; thresholded IoU for boxes), format, the box rewards iou,
iou_threshold, iou@<tau>, giou (0 on non-box samples), judge (a model behind an endpoint, `rewards/judge.py`) and
tool (an image came back from a tool and the answer is right).
User rewards are named `module:function` or `path/to/file.py:function` and are plain functions over the completion
and the sample's fields (see `user_reward`). Knows nothing of models, trainers or the Config object.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from vlgrpo.plugins import load_callable
from vlgrpo.rewards.boxes import Box, to_original_pixels
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.grounding import giou_reward, iou_reward, iou_threshold_reward
from vlgrpo.rewards.mathanswer import parse_gold, verify_parsed
from vlgrpo.rewards.parsed import ANSWER_PARSERS, Parsed, parsed
from vlgrpo.rewards.verifiable import number_match, text_match
from vlgrpo.types import InputError, Sample

RewardFn = Callable[[str | Parsed, Sample, RewardContext], float]
"""fn(completion, sample, ctx): the completion is its text, or the `Parsed` that score() shares between components."""


class RewardError(InputError):
    """A recipe entry that cannot be used (unknown name, bad weight, a user function that cannot be loaded)."""


# ---------------------------------------------------------------- helpers shared by the built-ins


def _gate_closed(p: Parsed, ctx: RewardContext) -> bool:
    """With reward.gate_accuracy_on_format, correctness counts only when the format holds (closes the hack where
    the format reward rises while accuracy stays flat)."""
    return ctx.gate_accuracy_on_format and not p.format_ok


def gold_boxes(sample: Sample) -> list[Box]:
    if not sample.boxes:
        raise ValueError(f"sample '{sample.id}' has no gold boxes (Sample.boxes) to score a box answer against")
    return [tuple(float(v) for v in b) for b in sample.boxes]  # type: ignore[misc]


def predicted_boxes(completion: str | Parsed, sample: Sample, ctx: RewardContext) -> list[Box]:
    """The completion's boxes in original-image pixels (ctx.box_format decides how they are read)."""
    if ctx.box_format != "plain" and sample.image_size is None:
        raise ValueError(
            f"sample '{sample.id}' has no image_size: box format '{ctx.box_format}' needs the original (width, "
            "height) to convert boxes; set Sample.image_size (vlgrpo.data.images.image_size reads it from the file)"
        )
    boxes = parsed(completion, ctx).boxes
    return to_original_pixels(boxes, ctx.box_format, sample.image_size, ctx.geometry) if boxes else []


def _gold_value(sample: Sample) -> Any:
    """The sample's gold answer read by its answer type's parser; a ValueError naming the sample when unreadable."""
    kind = sample.answer_type
    if kind == "math":
        try:
            return parse_gold(sample.answer or "")
        except ValueError as e:
            raise ValueError(f"sample '{sample.id}': {e}") from None
    if kind not in ANSWER_PARSERS:
        raise ValueError(f"sample '{sample.id}': answer_type {kind!r} has no accuracy reward")
    value = ANSWER_PARSERS[kind](sample.answer) if sample.answer else None
    if value is None:
        what = {"choice": "choice (option letter)", "yesno": "yes/no"}.get(kind, kind)
        raise ValueError(f"sample '{sample.id}': gold answer {sample.answer!r} is not a valid {what} answer")
    return value


# ---------------------------------------------------------------- the built-in rewards


def accuracy(completion: str | Parsed, sample: Sample, ctx: RewardContext) -> float:
    """1.0 when the answer is right for the sample's answer_type, else 0.0 (box: IoU >= ctx.iou_threshold).
    The gold answer is read first, so a bad gold row fails even for an empty completion."""
    kind = sample.answer_type
    if kind == "box":
        return iou_threshold(completion, sample, ctx)
    gold = _gold_value(sample)
    p = parsed(completion, ctx)
    if _gate_closed(p, ctx):
        return 0.0
    if kind == "math":
        return float(verify_parsed(gold, p.math))
    if kind == "number":
        return float(number_match(p.typed_answer(kind), gold, ctx.number_atol, ctx.number_rtol))
    if kind == "text":
        return float(text_match(p.answer, gold))
    return float(p.typed_answer(kind) == gold)


def format_reward(completion: str | Parsed, sample: Sample, ctx: RewardContext) -> float:
    """1.0 when the completion follows ctx.answer_format (think_answer or answer) and, with
    ctx.format_requires_answer, its answer parses for the sample's answer_type; else 0.0."""
    p = parsed(completion, ctx)
    if not p.format_ok:
        return 0.0
    return float(not ctx.format_requires_answer or p.typed_answer(sample.answer_type) is not None)


def _box_scores(completion: str | Parsed, sample: Sample, ctx: RewardContext) -> tuple[list[Box], list[Box]] | None:
    """(predicted, gold) boxes in original pixels; None on non-box samples (box rewards give 0 there, so a mixed
    dataset can share one recipe) and when the accuracy gate is closed."""
    p = parsed(completion, ctx)
    if sample.answer_type != "box" or _gate_closed(p, ctx):
        return None
    return predicted_boxes(p, sample, ctx), gold_boxes(sample)


def iou(completion: str | Parsed, sample: Sample, ctx: RewardContext) -> float:
    """Continuous IoU, greedily matched; extra and missed boxes count as 0 in the mean."""
    boxes = _box_scores(completion, sample, ctx)
    return 0.0 if boxes is None else iou_reward(*boxes)


def iou_threshold(
    completion: str | Parsed, sample: Sample, ctx: RewardContext, threshold: float | None = None
) -> float:
    """Share of boxes matched with IoU >= threshold (default ctx.iou_threshold); Acc@tau for one box."""
    boxes = _box_scores(completion, sample, ctx)
    return 0.0 if boxes is None else iou_threshold_reward(*boxes, ctx.iou_threshold if threshold is None else threshold)


def giou(completion: str | Parsed, sample: Sample, ctx: RewardContext) -> float:
    """Generalised IoU in [-1, 1], greedily matched; extra and missed boxes count as -1."""
    boxes = _box_scores(completion, sample, ctx)
    return 0.0 if boxes is None else giou_reward(*boxes)


def judge(completion: str | Parsed, sample: Sample, ctx: RewardContext) -> float:
    """The judge model's score in [0, 1] (reward.judge). score() sends a step's completions to the judge together,
    concurrently with the other components; called alone, this judges one completion and raises on a failure."""
    if ctx.judge is None:
        raise RewardError(NO_JUDGE)
    text = completion.text if isinstance(completion, Parsed) else completion
    verdict = ctx.judge.submit([text], [sample], ctx.answer_fallback).result()[0][0]
    if verdict.error:
        raise ValueError(f"judge: {verdict.error}")
    return verdict.score


def tool(completion: str | Parsed, sample: Sample, ctx: RewardContext) -> float:
    """DeepEyes' tool reward: 1 when a tool returned an image during the trajectory and the answer is right (by
    `accuracy`), else 0; so calling the tool pays only when it helped to answer."""
    p = parsed(completion, ctx)
    return float(p.images_returned > 0 and accuracy(p, sample, ctx) == 1.0)


NO_JUDGE = (
    "the recipe names 'judge' but no judge is configured: set reward.judge.base_url and reward.judge.model in the "
    "run config (an OpenAI-compatible server such as `vllm serve`)"
)

REWARDS: dict[str, RewardFn] = {
    "accuracy": accuracy,
    "format": format_reward,
    "iou": iou,
    "iou_threshold": iou_threshold,
    "giou": giou,
    "judge": judge,
    "tool": tool,
}
"""Built-in rewards by name. `iou@<tau>` (e.g. iou@0.75) is iou_threshold at that tau."""


# ---------------------------------------------------------------- resolving a recipe name


def sample_fields(sample: Sample) -> dict[str, Any]:
    """The keyword fields a user reward receives: Sample.to_dict() keys, image_size as a (width, height) tuple."""
    fields = sample.to_dict()
    fields["image_size"] = tuple(sample.image_size) if sample.image_size else None
    return fields


_FIELD_NAMES = frozenset(Sample("", "").to_dict()) | {"sample", "ctx"}


def _load_callable(spec: str) -> Callable:
    try:
        return load_callable(spec, "reward")
    except ValueError as e:
        raise RewardError(str(e)) from None


def user_reward(spec: str) -> RewardFn:
    """Wrap a user function `fn(completion, **fields) -> float` as a RewardFn.

    The first parameter receives the completion text; the others are filled by name from the sample's fields
    (id, question, answer, answer_type, image, boxes, objects, image_size, task, meta), plus `sample` (the Sample)
    and `ctx` (the RewardContext) when asked for. A `**kwargs` parameter receives every field.
    """
    fn = _load_callable(spec)
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise RewardError(f"reward '{spec}': the first parameter must take the completion text")
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params)
    wanted = {p.name for p in params[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [
        p.name
        for p in params[1:]
        if p.name not in _FIELD_NAMES and p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if missing:
        raise RewardError(
            f"reward '{spec}': parameter(s) {missing} are not sample fields; accepted names: "
            f"{', '.join(sorted(_FIELD_NAMES))} (or **kwargs)"
        )

    def call(completion: str | Parsed, sample: Sample, ctx: RewardContext) -> float:
        available = {**sample_fields(sample), "sample": sample, "ctx": ctx}
        kwargs = {k: v for k, v in available.items() if k in wanted or (takes_all and k not in ("sample", "ctx"))}
        return fn(completion.text if isinstance(completion, Parsed) else completion, **kwargs)

    call.__name__ = call.__qualname__ = spec
    return call


@functools.cache
def resolve_reward(name: str) -> RewardFn:
    """A recipe name -> its function: a built-in, `iou@<tau>`, or a user `module:function`."""
    if name in REWARDS:
        return REWARDS[name]
    if name.startswith("iou@"):
        try:
            tau = float(name[4:])
        except ValueError:
            tau = -1.0
        if not 0 <= tau <= 1:
            raise RewardError(f"reward '{name}': the threshold after 'iou@' must be a number in [0, 1], e.g. iou@0.75")
        return functools.partial(iou_threshold, threshold=tau)
    if ":" in name:
        return user_reward(name)
    raise RewardError(
        f"unknown reward '{name}'; accepted: {', '.join(REWARDS)}, iou@<tau>, or a user function as "
        "module:function or path/to/file.py:function"
    )
