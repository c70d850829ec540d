"""What each supported model family shares with its relatives, in one table: the layers below `vlgrpo.models`
(rewards, data, preflight, the planner) read a family's conventions here instead of comparing arch names.

Qwen3.5 is natively multimodal with Qwen3-VL's vision tower (16 px patches, merge 2, no DeepStack), Qwen3-VL's
bbox_2d on 0-1000 and its timestamped video prompts; its text model is hybrid (Gated DeltaNet linear attention in
three of every four layers). Imports nothing of vlgrpo: every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """The conventions of one `model.arch`."""

    box_format: str
    """The box convention its completions write (`reward.box_format` auto)."""
    patch_size: int
    """The vision tower's patch side in pixels (a merged token covers 2 x 2 patches)."""
    video_timestamps: bool
    """Its processor writes a timestamp before each video frame group (Qwen3-VL's `<t seconds>`)."""
    video_seconds: bool = False
    """Its M-RoPE spaces a video's temporal positions by seconds (Qwen2.5-VL's `second_per_grid_ts`); Qwen2-VL numbers
    them by patch, Qwen3-VL and Qwen3.5 write the times as text."""
    hybrid_attention: bool = False
    """Linear-attention (Gated DeltaNet) layers beside full attention: a recurrent state per sequence instead of KV,
    which the transformers cache carries and packing must reset per row."""
    thinking_template: bool = False
    """The released chat template opens `<think>` in the generation prompt when thinking is on (`data.thinking`)."""


FAMILIES: dict[str, Family] = {
    "qwen2_vl": Family(box_format="qwen2", patch_size=14, video_timestamps=False),
    "qwen2_5_vl": Family(box_format="qwen2_5", patch_size=14, video_timestamps=False, video_seconds=True),
    "qwen3_vl": Family(box_format="qwen3", patch_size=16, video_timestamps=True),
    "qwen3_5": Family(
        box_format="qwen3", patch_size=16, video_timestamps=True, hybrid_attention=True, thinking_template=True
    ),
}

REFUSED: dict[str, str] = {
    "qwen3_vl_moe": "a Qwen3-VL mixture-of-experts model, which vlgrpo does not train (model.arch qwen3_vl is the "
    "dense family: Qwen3-VL 2B, 4B, 8B, 32B)",
    "qwen3_5_moe": "a Qwen3.5 mixture-of-experts model (35B-A3B, 122B-A10B, 397B-A17B), which vlgrpo does not train "
    "(model.arch qwen3_5 is the dense family: Qwen3.5 0.8B, 2B, 4B, 9B, 27B)",
}
"""Model types vlgrpo names and refuses, with why and what to use instead."""


PROCESSOR_ARCH = {"Qwen2VLProcessor": "qwen2_vl", "Qwen2_5_VLProcessor": "qwen2_5_vl", "Qwen3VLProcessor": "qwen3_vl"}
"""The family of each Qwen processor class; Qwen3.5 ships Qwen3-VL's, whose video and image conventions it shares."""


def family_of(obj) -> Family:
    """The family of a transformers model (its `config.model_type`), a config, or a processor (its class): the one
    place that tells a loaded object's family; ValueError for anything else."""
    model_type = getattr(getattr(obj, "config", obj), "model_type", None)
    arch = model_type if model_type in FAMILIES else PROCESSOR_ARCH.get(type(obj).__name__)
    if arch is None:
        raise ValueError(
            f"cannot tell the model family of a {type(obj).__name__} (model_type {model_type!r}); accepted: "
            f"models and configs of {', '.join(FAMILIES)}, processors {', '.join(PROCESSOR_ARCH)}"
        )
    return FAMILIES[arch]


def family(arch: str) -> Family:
    """The conventions of a registered arch; ValueError naming the accepted ones."""
    if arch not in FAMILIES:
        why = f" ({REFUSED[arch]})" if arch in REFUSED else ""
        raise ValueError(f"model arch {arch!r}{why} is not supported; accepted: {', '.join(FAMILIES)}")
    return FAMILIES[arch]
