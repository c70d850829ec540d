"""The prompt contract of a checkpoint: how it was prompted in training (answer format, box convention, system prompt,
image pixel bounds, model arch), kept as `vlgrpo.json` beside the weights of every export and in every run directory.

`vlgrpo train` (through `model.name_or_path`), `vlgrpo eval --model` and `vlgrpo reward --model` take it as their
defaults; a setting given explicitly wins, and one that differs from the contract is reported. Knows nothing of
models or rewards: the writer passes the box convention already resolved from the model family.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from vlgrpo.config.schema import CHOICES, ConfigError

CONTRACT_FILE = "vlgrpo.json"
FORMAT = "vlgrpo-prompt-contract"
VERSION = 1
CONFIG_KEYS = {
    "arch": "model.arch",
    "answer_format": "data.answer_format",
    "box_format": "reward.box_format",
    "system_prompt": "data.system_prompt",
    "thinking": "data.thinking",
    "min_pixels": "model.min_pixels",
    "max_pixels": "model.max_pixels",
}
"""Each contract field and the config key it is the default of."""


@dataclass(frozen=True)
class PromptContract:
    arch: str
    """The model family (qwen2_vl, qwen2_5_vl): it decides the box convention and the processor."""
    answer_format: str
    """think_answer or answer: the instruction appended to every question."""
    box_format: str
    """How the model writes boxes (qwen2, qwen2_5, qwen3, plain), resolved: never auto."""
    system_prompt: str = ""
    min_pixels: int | None = None
    """The processor's image pixel bounds in training (None: the checkpoint processor's own)."""
    max_pixels: int | None = None
    max_new_tokens: int | None = None
    """The completion budget it was trained with (rollout.max_new_tokens): `vlgrpo eval`'s default, so reasoning is
    not cut shorter than in training. Not applied to a config (None: a contract written before it was recorded)."""
    thinking: str = "auto"
    """The chat template's thinking switch in training (data.thinking): auto, on or off."""
    video: dict | None = None
    """How videos were sampled in training (data.video: fps, max_frames, min_pixels, max_pixels): `vlgrpo eval`'s
    video settings, so a video row is prompted with the frames it was trained on. None: a contract written before it
    was recorded (eval then uses data.video's defaults)."""

    def __post_init__(self) -> None:
        accepted = {
            "arch": [a for a in CHOICES["model.arch"] if a != "auto"],
            "answer_format": CHOICES["data.answer_format"],
            "thinking": CHOICES["data.thinking"],
            "box_format": [b for b in CHOICES["reward.box_format"] if b != "auto"],
        }
        for key, values in accepted.items():
            if getattr(self, key) not in values:
                raise ValueError(f"{key} = {getattr(self, key)!r} is not accepted; use one of: {', '.join(values)}")
        for key in ("min_pixels", "max_pixels", "max_new_tokens"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{key} = {value!r} is not accepted; use a positive integer or null")
        if not isinstance(self.system_prompt, str):
            raise ValueError(f"system_prompt = {self.system_prompt!r} is not accepted; use a string")
        video_keys = {"fps", "max_frames", "min_pixels", "max_pixels"}
        if self.video is not None and (not isinstance(self.video, dict) or set(self.video) != video_keys):
            raise ValueError(
                f"video = {self.video!r} is not accepted; use null or a mapping of {', '.join(sorted(video_keys))}"
            )

    @classmethod
    def from_config(cls, cfg: Any, arch: str, box_format: str) -> PromptContract:
        """The contract of a run of `cfg` on a model of family `arch` writing boxes as `box_format`."""
        video = {k: getattr(cfg.data.video, k) for k in ("fps", "max_frames", "min_pixels", "max_pixels")}
        return cls(
            arch=arch,
            answer_format=cfg.data.answer_format,
            box_format=box_format,
            system_prompt=cfg.data.system_prompt,
            min_pixels=cfg.model.min_pixels,
            max_pixels=cfg.model.max_pixels,
            max_new_tokens=cfg.rollout.max_new_tokens,
            thinking=cfg.data.thinking,
            video=video,
        )

    def write(self, directory: str | Path) -> Path:
        """Write `directory/vlgrpo.json` atomically (a reader sees the old file or the new one, never half)."""
        path = Path(directory) / CONTRACT_FILE
        tmp = path.with_name(f".{CONTRACT_FILE}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"format": FORMAT, "version": VERSION, **asdict(self)}, indent=2) + "\n")
        os.replace(tmp, path)
        return path


def read_contract(location: str | Path) -> PromptContract | None:
    """The contract in `location` (a directory holding vlgrpo.json, or the file itself); None when there is none,
    as for a hub id or a checkpoint vlgrpo did not write. A damaged file is a ConfigError naming it."""
    path = Path(location)
    path = path / CONTRACT_FILE if path.is_dir() else path
    if path.name != CONTRACT_FILE or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"prompt contract '{path}' is not valid UTF-8 JSON ({e}); delete it or write it again with `vlgrpo export`"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f'\'{path}\' is not a vlgrpo prompt contract (expected "format": "{FORMAT}")')
    if doc.get("version") != VERSION:
        raise ConfigError(
            f"prompt contract '{path}' has version {doc.get('version')!r}; this vlgrpo reads "
            f"version {VERSION}: upgrade vlgrpo"
        )
    names = [f.name for f in fields(PromptContract)]
    unknown = sorted(set(doc) - set(names) - {"format", "version"})
    missing = [n for n in ("arch", "answer_format", "box_format") if n not in doc]
    if unknown or missing:
        raise ConfigError(
            f"prompt contract '{path}': unknown keys {unknown}, missing keys {missing}; "
            f"accepted keys: {', '.join(names)}"
        )
    try:
        return PromptContract(**{n: doc[n] for n in names if n in doc})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"prompt contract '{path}': {e}") from None


def apply_contract(cfg: Any, contract: PromptContract, explicit: set[str]) -> list[str]:
    """Set each config key of the contract that is not in `explicit` (the dotted keys the user gave) to the
    contract's value; returns one line per explicit key that differs from the contract."""
    notes = []
    for name, key in CONFIG_KEYS.items():
        section, leaf = key.split(".")
        value, current = getattr(contract, name), getattr(getattr(cfg, section), leaf)
        if key not in explicit:
            setattr(getattr(cfg, section), leaf, value)
        elif current != value and not (name == "box_format" and current == "auto"):
            notes.append(f"{key} = {current!r}, but the checkpoint was trained with {value!r} (its {CONTRACT_FILE})")
    return notes
