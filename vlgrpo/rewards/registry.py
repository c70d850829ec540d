"""The named rewards: a plain dict from name to `fn(completion, sample, ctx) -> float`, plus user functions.

Built-ins: accuracy (dispatch on answer_type; thresholded IoU for boxes), format, and the box rewards iou,
iou_threshold, iou@<tau>, giou (0 on non-box samples).
User rewards are named `module:function` or `path/to/file.py:function` and are plain functions over the completion
and the sample's fields (see `user_reward`). Knows nothing of models, trainers or the Config object.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Callable

from vlgrpo.rewards.boxes import Box, parse_boxes, to_original_pixels
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.extract import answer_region, extract_answer
from vlgrpo.rewards.format import format_ok
from vlgrpo.rewards.grounding import giou_reward, iou_reward, iou_threshold_reward
from vlgrpo.rewards.verifiable import (
    math_match,
    number_match,
    parse_choice,
    parse_number,
    parse_yesno,
    text_match,
)
from vlgrpo.types import InputError, Sample

RewardFn = Callable[[str, Sample, RewardContext], float]


class RewardError(InputError):
    """A recipe entry that cannot be used (unknown name, bad weight, a user function that cannot be loaded)."""


# ---------------------------------------------------------------- helpers shared by the built-ins


def _gate_closed(completion: str, ctx: RewardContext) -> bool:
    """With reward.gate_accuracy_on_format, correctness counts only when the format holds (closes the hack where
    the format reward rises while accuracy stays flat)."""
    return ctx.gate_accuracy_on_format and not format_ok(completion, ctx.answer_format)


def gold_boxes(sample: Sample) -> list[Box]:
    if not sample.boxes:
        raise ValueError(f"sample '{sample.id}' has no gold boxes (Sample.boxes) to score a box answer against")
    return [tuple(float(v) for v in b) for b in sample.boxes]  # type: ignore[misc]


def predicted_boxes(completion: str, sample: Sample, ctx: RewardContext) -> list[Box]:
    """The completion's boxes in original-image pixels (ctx.box_format decides how they are read)."""
    if ctx.box_format != "plain" and sample.image_size is None:
        raise ValueError(
            f"sample '{sample.id}' has no image_size: box format '{ctx.box_format}' needs the original (width, "
            "height) to convert boxes; set Sample.image_size (vlgrpo.data.images.image_size reads it from the file)"
        )
    region = answer_region(completion)
    if region is None:  # several or malformed answer blocks: no answer
        return []
    return to_original_pixels(parse_boxes(region, ctx.box_format), ctx.box_format, sample.image_size, ctx.geometry)


def _not_scored_as_box(completion: str, sample: Sample, ctx: RewardContext) -> bool:
    """Box rewards give 0 on non-box samples (so a mixed dataset can share one recipe) and when the gate is closed."""
    return sample.answer_type != "box" or _gate_closed(completion, ctx)


def _gold_value(sample: Sample, parser: Callable[[str], Any], kind: str) -> Any:
    value = parser(sample.answer) if sample.answer else None
    if value is None:
        raise ValueError(f"sample '{sample.id}': gold answer {sample.answer!r} is not a valid {kind} answer")
    return value


# ---------------------------------------------------------------- the built-in rewards


def accuracy(completion: str, sample: Sample, ctx: RewardContext) -> float:
    """1.0 when the answer is right for the sample's answer_type, else 0.0 (box: IoU >= ctx.iou_threshold)."""
    kind = sample.answer_type
    if kind == "box":
        return iou_threshold(completion, sample, ctx)
    if _gate_closed(completion, ctx):
        return 0.0
    if kind == "math":
        region = answer_region(completion)
        return float(region is not None and math_match(region, _gold_value(sample, str.strip, "math")))
    pred = extract_answer(completion, ctx.answer_fallback)
    if kind == "number":
        gold = _gold_value(sample, parse_number, "number")
        return float(number_match(parse_number(pred), gold, ctx.number_atol, ctx.number_rtol))
    if kind == "choice":
        return float(parse_choice(pred) == _gold_value(sample, parse_choice, "choice (option letter)"))
    if kind == "yesno":
        return float(parse_yesno(pred) == _gold_value(sample, parse_yesno, "yes/no"))
    if kind == "text":
        return float(text_match(pred, _gold_value(sample, str.strip, "text")))
    raise ValueError(f"sample '{sample.id}': answer_type {kind!r} has no accuracy reward")


def format_reward(completion: str, sample: Sample, ctx: RewardContext) -> float:
    """1.0 when the completion follows ctx.answer_format (think_answer or answer), else 0.0."""
    return float(format_ok(completion, ctx.answer_format))


def iou(completion: str, sample: Sample, ctx: RewardContext) -> float:
    """Continuous IoU, greedily matched; extra and missed boxes count as 0 in the mean."""
    if _not_scored_as_box(completion, sample, ctx):
        return 0.0
    return iou_reward(predicted_boxes(completion, sample, ctx), gold_boxes(sample))


def iou_threshold(completion: str, sample: Sample, ctx: RewardContext, threshold: float | None = None) -> float:
    """Share of boxes matched with IoU >= threshold (default ctx.iou_threshold); Acc@tau for one box."""
    if _not_scored_as_box(completion, sample, ctx):
        return 0.0
    tau = ctx.iou_threshold if threshold is None else threshold
    return iou_threshold_reward(predicted_boxes(completion, sample, ctx), gold_boxes(sample), tau)


def giou(completion: str, sample: Sample, ctx: RewardContext) -> float:
    """Generalised IoU in [-1, 1], greedily matched; extra and missed boxes count as -1."""
    if _not_scored_as_box(completion, sample, ctx):
        return 0.0
    return giou_reward(predicted_boxes(completion, sample, ctx), gold_boxes(sample))


REWARDS: dict[str, RewardFn] = {
    "accuracy": accuracy,
    "format": format_reward,
    "iou": iou,
    "iou_threshold": iou_threshold,
    "giou": giou,
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
    target, _, attr = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
            module_spec = importlib.util.spec_from_file_location(f"vlgrpo_user_reward_{path.stem}", path)
            if module_spec is None or module_spec.loader is None or not path.is_file():
                raise FileNotFoundError(f"no such file {path}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except Exception as e:  # noqa: BLE001 - any import-time failure is reported the same way
        raise RewardError(f"reward '{spec}': cannot load '{target}' ({type(e).__name__}: {e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"reward '{spec}': '{target}' has no function '{attr}'")
    return fn


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
    missing = [p.name for p in params[1:] if p.name not in _FIELD_NAMES and p.default is p.empty
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]  # fmt: skip
    if missing:
        raise RewardError(
            f"reward '{spec}': parameter(s) {missing} are not sample fields; accepted names: "
            f"{', '.join(sorted(_FIELD_NAMES))} (or **kwargs)"
        )

    def call(completion: str, sample: Sample, ctx: RewardContext) -> float:
        available = {**sample_fields(sample), "sample": sample, "ctx": ctx}
        kwargs = {k: v for k, v in available.items() if k in wanted or (takes_all and k not in ("sample", "ctx"))}
        return fn(completion, **kwargs)

    call.__name__ = call.__qualname__ = spec
    return call


@functools.lru_cache(maxsize=None)
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
