"""Pre-flight checks of whole datasets (`vlgrpo data doctor`): every row, every image and video, prompt length (and
with tools, the trajectory's), boxes, image placeholders, gold answers against the configured reward, duplicate ids and
the answer distribution.

Loads no model: image and video tokens come from Qwen's smart_resize geometry (read from the checkpoint directory
when it is local). Rewards are a layer above data: the checks take the gold-answer check as a plain function argument,
which `vlgrpo.preflight.reward_checker` builds from the run's recipe.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vlgrpo.data.adapters import raw_rows, schema_sample, skip_reason
from vlgrpo.data.doctor_report import (
    CHARS_PER_TOKEN,
    ERROR,
    WARNING,
    DoctorReport,
    DoctorSettings,
    Finding,
    SplitStats,
)
from vlgrpo.data.images import DEFAULT_GEOMETRY
from vlgrpo.data.inspection import image_key, inspect_images, inspect_videos, video_key
from vlgrpo.data.jsonl import ACCEPTED
from vlgrpo.data.preset_fields import ConversionReport, RowSkipped
from vlgrpo.data.presets import convert_rows
from vlgrpo.data.prompts import MAX_TOOL_TEXT_TOKENS, instruction
from vlgrpo.data.rowcheck import (
    TOOL_RESPONSE_TOKENS,
    PromptBudget,
    RowVisuals,
    prompt_budget,
    row_problems,
    trajectory_tokens,
)
from vlgrpo.data.schema import DataError
from vlgrpo.types import Sample

HUB_GEOMETRY = DEFAULT_GEOMETRY
"""The released Qwen2-VL / Qwen2.5-VL processors' geometry (up to 16,384 tokens); defined once in data.images."""
SKEW_TYPES, SKEW_MIN_SAMPLES, SKEW_SHARE = ("yesno", "choice"), 20, 0.75
CORRECTNESS = ("accuracy", "iou", "iou_threshold", "giou")

GoldCheck = Callable[[Sample, "tuple[int, int] | None"], list[tuple[str, str, str]]]
"""(sample, real (width, height) or None) -> [(severity, check, message)] about its gold answer."""


# ---------------------------------------------------------------- reading rows with their row numbers


def iter_rows(source: str, settings: DoctorSettings) -> tuple[str, Path | None, Iterator[tuple[int, Any]]]:
    """(name for messages, base directory of relative image paths, (row number, schema row or DataError)): the
    rows exactly as `load_samples` reads them, preset and column renames included, each with its row number."""
    name, base, rows = raw_rows(source, settings.data_format)
    if settings.preset != "none" or settings.columns:
        report = ConversionReport(settings.preset)
        rows = convert_rows(rows, settings.preset, dict(settings.columns), name, base, report)
    return name, base, rows


# ---------------------------------------------------------------- the checks


def text_estimate(text: str, system_prompt: str) -> int:
    """Text tokens of a prompt, estimated from its characters (on the long side): question + instruction + system."""
    return math.ceil((len(text) + len(system_prompt)) / CHARS_PER_TOKEN)


def _parts(s: Sample, visuals: RowVisuals, budget: PromptBudget) -> str:
    """What a prompt's visual tokens are made of, for the length messages."""
    if len(s.images) == 1 and s.video is None:
        w, h = visuals.images[0].decoded
        return f"the {w}x{h} image alone gives {budget.visual} image tokens"
    parts = []
    if s.images:
        parts.append(f"its {len(s.images)} image(s) ({' + '.join(map(str, budget.images))} tokens)")
    if visuals.video is not None:
        (w, h), n = visuals.video.size, len(visuals.video.indices)
        parts.append(f"its video ({n} frames of {w}x{h} px: {budget.video} tokens)")
    return f"{' and '.join(parts)}: {budget.visual} visual tokens"


def sample_findings(
    s: Sample, visuals: RowVisuals, settings: DoctorSettings
) -> tuple[list[tuple[str, str, str]], int, int]:
    """([(severity, check, message)], visual tokens, estimated prompt tokens) of one sample whose images and video
    were inspected; the token counts are 0 when one of them is unusable."""
    problems = row_problems(s, visuals, settings.geometry)
    out = [(ERROR, check, msg) for check, msg in problems]
    text = f"{s.question} {instruction(s.answer_type, settings.answer_format, settings.box_format)}"
    budget = prompt_budget(
        s,
        visuals,
        settings.geometry,
        text_estimate(text, settings.system_prompt),
        settings.system_prompt,
        settings.video_timestamps,
    )
    if not all(budget.images) or (s.video is not None and not budget.video):
        return out, 0, 0
    limit = settings.max_prompt_length
    if budget.certain > limit:
        out.append(
            (
                ERROR,
                "prompt_too_long",
                f"{_parts(s, visuals, budget)}, {budget.certain} with the chat template, "
                f"over data.max_prompt_length={limit}: lower model.max_pixels (data.video.max_pixels or "
                "max_frames for a video) or raise data.max_prompt_length",
            )
        )
    elif budget.total > limit:
        out.append(
            (
                WARNING,
                "prompt_maybe_too_long",
                f"about {budget.total} prompt tokens ({budget.visual} visual + ~"
                f"{budget.total - budget.visual} text) may exceed data.max_prompt_length={limit}",
            )
        )
    if budget.certain <= limit:  # a longer prompt is skipped in training, and reported above
        out += trajectory_findings(budget, settings)
    return out, budget.visual, budget.total


def trajectory_findings(budget: PromptBudget, settings: DoctorSettings) -> list[tuple[str, str, str]]:
    """The row's prompt against rollout.max_total_length: an error when not even one turn fits after it; with tools, a
    warning when its turns and tool responses may pass it (each crop at most the row's largest image's tokens)."""
    s, most = settings, settings.max_total_length
    if most is None:
        return []
    if budget.certain + s.max_new_tokens > most:
        return [
            (
                ERROR,
                "trajectory_too_long",
                f"prompt {budget.certain} tokens + one turn of rollout.max_new_tokens={s.max_new_tokens} passes "
                f"rollout.max_total_length={most}: no turn fits; raise rollout.max_total_length or lower "
                "model.max_pixels",
            )
        ]
    crop = max(budget.images, default=0)
    after = trajectory_tokens(s.max_new_tokens, s.max_turns, crop)
    if s.max_turns > 1 and budget.total + after > most:
        return [
            (
                WARNING,
                "trajectory_maybe_cut",
                f"prompt ~{budget.total} tokens + up to {after} over max_turns={s.max_turns} turns ({s.max_turns} x "
                f"{s.max_new_tokens} sampled + {s.max_turns - 1} tool responses of up to {crop} crop tokens + "
                f"{TOOL_RESPONSE_TOKENS} markup + {MAX_TOOL_TEXT_TOKENS} text each) may pass "
                f"rollout.max_total_length={most}: the trajectory is cut there",
            )
        ]
    return []


def _count(stats: SplitStats, s: Sample, tokens: int, estimate: int) -> None:
    stats.samples += 1
    stats.answer_types[s.answer_type] += 1
    stats.tasks[s.task or "(none)"] += 1
    if s.answer_type != "box" and s.answer:
        stats.answers.setdefault(s.answer_type, Counter())[s.answer.strip().lower()] += 1
    if tokens:
        stats.image_tokens.append(tokens)
        stats.prompt_tokens_max = max(stats.prompt_tokens_max, estimate)


def check_split(
    name: str,
    source: str,
    settings: DoctorSettings,
    gold_check: GoldCheck | None = None,
    progress: bool = False,
    workers: int = 8,
) -> tuple[SplitStats, list[Finding]]:
    """Every row of one dataset: schema, image, per-sample checks, gold answers, duplicate ids, answer skew."""
    stats, findings = SplitStats(name, source), []
    try:
        src_name, base, rows = iter_rows(source, settings)
    except DataError as e:
        return stats, [Finding(ERROR, "dataset_unreadable", name, source, None, None, e.problem)]

    def add(severity: str, check: str, row: int | None, sid: str | None, msg: str, fld: str | None = None) -> None:
        findings.append(Finding(severity, check, name, src_name, row, sid, msg, fld))

    # 1. every row through the schema; ids must be unique
    samples: list[tuple[int, Sample]] = []
    for no, raw in rows:
        stats.rows += 1
        try:
            if isinstance(raw, DataError):
                raise raw
            s = schema_sample(raw, src_name, no, base)  # an unknown field names the preset the row looks like
        except DataError as e:  # inverted/empty boxes, boxes outside a declared image_size, missing fields, ...
            severity = WARNING if isinstance(e, RowSkipped) else ERROR  # a preset's skip: training skips it too
            add(severity, skip_reason(e), no, raw.get("id") if isinstance(raw, dict) else None, e.problem, e.field)
            continue
        if s.id in stats.ids:
            add(
                ERROR,
                "duplicate_id",
                no,
                s.id,
                f"id {s.id!r} was already used at row {stats.ids[s.id]}: ids must "
                "be unique (prompts, predictions and reward failures are keyed by them)",
            )
        stats.ids.setdefault(s.id, no)
        samples.append((no, s))
    if stats.rows == 0:
        add(
            ERROR,
            "dataset_empty",
            None,
            None,
            f"holds no rows (an empty file, or only blank lines): nothing to train or evaluate on; {ACCEPTED}",
        )
    # 2. every distinct image opened completely, every distinct video decoded, once
    images = inspect_images([im for _, s in samples for im in s.images], workers, progress, f"doctor {name}")
    videos = inspect_videos([s.video for _, s in samples if s.video is not None], settings.video)
    stats.images, stats.videos = len(images), len(videos)
    # 3. per sample: images, video, tokens, boxes, placeholders, then the gold answer against the reward
    for no, s in samples:
        visuals = RowVisuals(
            [images[image_key(im)] for im in s.images], videos[video_key(s.video)] if s.video is not None else None
        )
        problems, tokens, estimate = sample_findings(s, visuals, settings)
        if gold_check is not None:
            problems += gold_check(s, visuals.images[0].decoded if s.image is not None else None)
        for severity, check, msg in problems:
            add(severity, check, no, s.id, msg)
        _count(stats, s, tokens, estimate)
    findings += _skew(name, src_name, stats)
    return stats, findings


def _skew(split: str, source: str, stats: SplitStats) -> list[Finding]:
    """A warning when one yes/no (or option) answer dominates: always giving it would already score that share."""
    out = []
    for kind in SKEW_TYPES:
        counts = stats.answers.get(kind, Counter())
        n = sum(counts.values())
        if n >= SKEW_MIN_SAMPLES:
            top, k = counts.most_common(1)[0]
            if k / n > SKEW_SHARE:
                out.append(
                    Finding(
                        WARNING,
                        "answer_skew",
                        split,
                        source,
                        None,
                        None,
                        f"{k} of the {n} '{kind}' answers ({k / n:.0%}) are {top!r}: a policy that always "
                        f"answers {top!r} scores {k / n:.0%}; balance the classes or judge accuracy "
                        "against that baseline",
                    )
                )
    return out


def run_doctor(
    splits: dict[str, str],
    settings: DoctorSettings,
    gold_check: GoldCheck | None = None,
    progress: bool = False,
    workers: int = 8,
) -> DoctorReport:
    """Check each named dataset; ids shared between splits are a warning (a test sample seen in training)."""
    report = DoctorReport(settings)
    ids: dict[str, dict[str, int]] = {}
    for name, source in splits.items():
        stats, findings = check_split(name, source, settings, gold_check, progress, workers)
        report.splits[name], report.findings = stats, report.findings + findings
        ids[name] = stats.ids
    names = list(ids)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            shared = sorted(set(ids[a]) & set(ids[b]))
            if shared:
                report.findings.append(
                    Finding(
                        WARNING,
                        "split_overlap",
                        f"{a}/{b}",
                        splits[b],
                        ids[b][shared[0]],
                        shared[0],
                        f"{len(shared)} id(s) appear in both {a} and {b} (first: {shared[0]!r}): a held-out sample "
                        "that is also trained on inflates the eval",
                    )
                )
    return report


# ---------------------------------------------------------------- the summary table
