"""`vlgrpo data doctor` from a run config: what the data checks (`vlgrpo.data.doctor`) compare a dataset against
(the processor geometry read from the checkpoint directory, no model loaded; the model family's box convention; the
row shape, data.preset / data.columns) and the gold-answer check built from the configured reward recipe.

Sits above data and rewards, which know nothing of each other.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from vlgrpo.config import ConfigError, get_key, load_config
from vlgrpo.data.doctor import (
    CORRECTNESS, ERROR, WARNING, DoctorReport, DoctorSettings, GoldCheck, run_doctor,
)  # fmt: skip
from vlgrpo.data.images import checkpoint_geometry
from vlgrpo.data.prompts import check_system_prompt
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
    geometry, source = processor_geometry(m.name_or_path, m.min_pixels, m.max_pixels)
    ctx = context_from_config(cfg, detect_arch(m.name_or_path) if m.arch == "auto" else m.arch, geometry)
    settings = DoctorSettings(
        geometry=geometry, geometry_source=source, max_prompt_length=cfg.data.max_prompt_length,
        answer_format=cfg.data.answer_format, box_format=ctx.box_format, system_prompt=cfg.data.system_prompt,
        data_format=cfg.data.format, preset=cfg.data.preset, columns=dict(cfg.data.columns),
    )  # fmt: skip
    return settings, ctx


def reward_checker(recipe: dict[str, float], ctx) -> GoldCheck:
    """Score a completion that states each gold answer with the run's recipe: a reward that raises means the gold
    answer cannot be parsed (error); a correctness reward below 1 means it can never earn full marks (warning)."""
    check_recipe(recipe)  # an unknown reward name fails here, once

    def check(s: Sample, size: tuple[int, int] | None) -> list[tuple[str, str, str]]:
        if s.answer_type == "box" and size is None:
            return []  # the image problem is already reported; boxes cannot be rendered without its size
        sized = s if size is None else dataclasses.replace(s, image_size=size)  # boxes scale by the decoded size
        text = render_completion(sized, ctx.answer_format, ctx.box_format, ctx.geometry, decimals=6)
        batch = score([text], [s], recipe, ctx)
        out = [(ERROR, "gold_unparseable", f"reward '{name}' cannot score the gold answer: {err}")
               for _, name, err in batch.failures]  # fmt: skip
        low = [n for n, v in batch.components.items() if v[0] < 1 - 1e-4 and (n == "accuracy" or (
            s.answer_type == "box" and (n in CORRECTNESS or n.startswith("iou@"))))]  # fmt: skip
        if low and not out:
            gold = s.boxes if s.answer_type == "box" else s.answer
            out.append((WARNING, "gold_not_full_marks", f"a completion stating the gold answer {gold!r} earns "
                        f"{', '.join(f'{n}={batch.components[n][0]:.4g}' for n in low)}, not 1"))  # fmt: skip
        return out

    return check


CONFIG_SUFFIXES = (".yaml", ".yml")
SPLIT_KEYS = {"train": "data.train", "val": "data.val", "test": "data.test", "eval": "eval.data"}


def diagnose(target: str, overrides: list[str] | None = None, splits: list[str] | None = None,
             progress: bool = False, workers: int = 8) -> DoctorReport:  # fmt: skip
    """`vlgrpo data doctor TARGET`: a run config (checks data.train / val / test and eval.data with the run's
    geometry, lengths and reward) or one dataset (checked with the config defaults plus `overrides`)."""
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
            raise ConfigError(f"--split {unknown}: this target has {', '.join(found)} "
                              f"({', '.join(SPLIT_KEYS[n] for n in found if n in SPLIT_KEYS) or 'a dataset'})")
        found = {n: found[n] for n in splits}
    settings, ctx = settings_from_config(cfg)
    return run_doctor(found, settings, reward_checker(dict(cfg.reward.recipe), ctx), progress, workers)
