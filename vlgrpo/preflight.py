"""`vlgrpo data doctor` from a run config: what the data checks (`vlgrpo.data.doctor`) compare a dataset against
(the processor geometry read from the checkpoint directory, no model loaded; the model family's box convention; the
row shape, data.preset / data.columns) and the gold-answer check built from the configured reward recipe.

Sits above data and rewards, which know nothing of each other; below the evals, whose in-loop data check the CLI
hands in as a function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlgrpo.config import ConfigError, get_key, load_config
from vlgrpo.data.doctor import CORRECTNESS, GoldCheck, run_doctor
from vlgrpo.data.doctor_report import ERROR, WARNING, DoctorReport, DoctorSettings, Finding
from vlgrpo.data.images import checkpoint_geometry
from vlgrpo.data.prompts import check_system_prompt
from vlgrpo.data.video import VideoSampling
from vlgrpo.families import family
from vlgrpo.memory.from_config import total_length
from vlgrpo.models import detect_arch
from vlgrpo.rewards import check_recipe, context_from_config, score
from vlgrpo.rewards.render import render_completion
from vlgrpo.types import Sample

processor_geometry = checkpoint_geometry
"""The resize geometry a run will use; defined once in `vlgrpo.data.images`."""


def settings_from_config(cfg) -> tuple[DoctorSettings, Any]:
    """(DoctorSettings, RewardContext) of a run config: geometry, prompt settings and the reward's context."""
    check_system_prompt(cfg.data.system_prompt)  # every prompt holds it: a config error (exit 2), not a row's
    m = cfg.model
    arch = detect_arch(m.name_or_path) if m.arch == "auto" else m.arch
    geometry, source = processor_geometry(m.name_or_path, m.min_pixels, m.max_pixels, arch=arch)
    ctx = context_from_config(cfg, arch, geometry)
    settings = DoctorSettings(
        geometry=geometry,
        geometry_source=source,
        max_prompt_length=cfg.data.max_prompt_length,
        answer_format=cfg.data.answer_format,
        box_format=ctx.box_format,
        system_prompt=cfg.data.system_prompt,
        data_format=cfg.data.format,
        preset=cfg.data.preset,
        columns=dict(cfg.data.columns),
        video=VideoSampling.from_config(cfg.data.video),
        video_timestamps=family(arch).video_timestamps,
        max_new_tokens=cfg.rollout.max_new_tokens,
        max_turns=cfg.rollout.max_turns,
        max_total_length=total_length(cfg, geometry),
    )
    return settings, ctx


def reward_checker(recipe: dict[str, float], ctx) -> GoldCheck:
    """Score a completion that states each gold answer with the run's recipe: a reward that raises means the gold
    answer cannot be parsed (error); a correctness reward below 1 means it can never earn full marks (warning). The
    judge is left out: a request per row would load its server for nothing."""
    check_recipe(recipe)  # an unknown reward name fails here, once
    recipe = {name: weight for name, weight in recipe.items() if name != "judge"}  # it parses no gold answer

    def check(s: Sample, size: tuple[int, int] | None) -> list[tuple[str, str, str]]:
        if not recipe or (s.answer_type == "box" and size is None):
            return []  # the image problem is already reported; boxes cannot be rendered without its size
        sized = s if size is None else dataclasses.replace(s, image_size=size)  # boxes scale by the decoded size
        text = render_completion(sized, ctx.answer_format, ctx.box_format, ctx.geometry, decimals=6)
        # as training scores it: the declared image_size, else the one read from the image
        batch = score([text], [s if s.image_size is not None else sized], recipe, ctx)
        out = [
            (ERROR, "gold_unparseable", f"reward '{name}' cannot score the gold answer: {err}")
            for _, name, err in batch.failures
        ]
        low = [
            n
            for n, v in batch.components.items()
            if v[0] < 1 - 1e-4
            and (n == "accuracy" or (s.answer_type == "box" and (n in CORRECTNESS or n.startswith("iou@"))))
        ]
        if low and not out:
            gold = s.boxes if s.answer_type == "box" else s.answer
            out.append(
                (
                    WARNING,
                    "gold_not_full_marks",
                    f"a completion stating the gold answer {gold!r} earns "
                    f"{', '.join(f'{n}={batch.components[n][0]:.4g}' for n in low)}, not 1",
                )
            )
        return out

    return check


CONFIG_SUFFIXES = (".yaml", ".yml")
SPLIT_KEYS = {"train": "data.train", "val": "data.val", "test": "data.test", "eval": "eval.data"}


def diagnose(
    target: str,
    overrides: list[str] | None = None,
    splits: list[str] | None = None,
    progress: bool = False,
    workers: int = 8,
    eval_check: Callable[[Any], str | None] | None = None,
) -> DoctorReport:
    """`vlgrpo data doctor TARGET`: a run config (checks data.train / val / test and eval.data with the run's
    geometry, lengths and reward) or one dataset (checked with the config defaults plus `overrides`).

    `eval_check(cfg)`: what `vlgrpo train` would refuse about the in-loop eval's data, or None
    (`vlgrpo.evals.run.in_loop_eval_problem`, passed in by the CLI: the evals sit above this module); an answer is
    an `eval_suites` error."""
    is_config = Path(target).suffix in CONFIG_SUFFIXES
    dataset = [] if is_config else [f"data.train={target}"]
    cfg = load_config(target if is_config else None, dataset + list(overrides or []))
    if is_config:
        found: dict[str, str] = {}
        for name, key in SPLIT_KEYS.items():
            path = get_key(cfg, key)
            if path and path not in found.values():  # eval.data is often data.val: check it once
                found[name] = path
    else:
        found = {Path(target).name: target}
    if splits:
        unknown = [s for s in splits if s not in found]
        if unknown:
            raise ConfigError(
                f"--split {unknown}: this target has {', '.join(found)} "
                f"({', '.join(SPLIT_KEYS[n] for n in found if n in SPLIT_KEYS) or 'a dataset'})"
            )
        found = {n: found[n] for n in splits}
    settings, ctx = settings_from_config(cfg)
    report = run_doctor(found, settings, reward_checker(dict(cfg.reward.recipe), ctx), progress, workers)
    if is_config and eval_check is not None:
        report.findings += _eval_findings(cfg, found, report, eval_check)
    return report


def _eval_findings(
    cfg, found: dict[str, str], report: DoctorReport, eval_check: Callable[[Any], str | None]
) -> list[Finding]:
    """The `eval_suites` error when `vlgrpo train` would refuse the in-loop eval's data (a suite with nothing to run
    on, or no eval data at all); nothing when --split left that data out, or when its file is already reported
    unreadable or empty."""
    source = cfg.eval.data or cfg.data.val
    split = next((name for name, path in found.items() if path == source), None)
    if source and split is None:
        return []
    if any(f.split == split and f.check in ("dataset_unreadable", "dataset_empty") for f in report.findings):
        return []
    problem = eval_check(cfg)
    if problem is None:
        return []
    return [Finding(ERROR, "eval_suites", split or "eval", source or "(none)", None, None, problem)]
