"""What each supported model family shares with its relatives, in one table: its transformers classes (named, imported
on use), its processor's released geometry, its box convention, its video conventions and which layers it has. Every
other module reads a family's facts here instead of comparing arch names; adding a family is a row here and the code
that truly differs (its tiny config, its parameter formulas).

Qwen3.5 is natively multimodal with Qwen3-VL's vision tower (16 px patches, merge 2, no DeepStack), Qwen3-VL's
bbox_2d on 0-1000 and its timestamped video prompts; its text model is hybrid (Gated DeltaNet linear attention in
three of every four layers). Imports nothing of vlgrpo, nor torch or transformers: every layer may read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Family:
    """The conventions of one `model.arch`."""

    model_class: str
    """Its transformers model class (`vlgrpo.models` loads it)."""
    processor_class: str
    """Its released processor's transformers class (Qwen3.5 ships Qwen3-VL's)."""
    config_class: str
    """Its transformers config class (`vlgrpo.tiny` builds one)."""
    box_format: str
    """The box convention its completions write (`reward.box_format` auto)."""
    patch_size: int
    """The vision tower's patch side in pixels (a merged token covers 2 x 2 patches)."""
    min_pixels: int
    """Its released processors' smallest image area (preprocessor_config.json `size.shortest_edge`)."""
    max_pixels: int
    """Its released processors' largest image area (`size.longest_edge`)."""
    video_timestamps: bool
    """Its processor writes a timestamp before each video frame group (Qwen3-VL's `<t seconds>`)."""
    video_seconds: bool = False
    """Its M-RoPE spaces a video's temporal positions by seconds (Qwen2.5-VL's `second_per_grid_ts`); Qwen2-VL numbers
    them by patch, Qwen3-VL and Qwen3.5 write the times as text."""
    qwen3: bool = False
    """Qwen3 attention (no q/k/v biases, an RMSNorm over each head's queries and keys; head_dim stated, 128 by default)
    and Qwen3-VL's tower (a patch-embedding bias, learned position embeddings)."""
    vision_swiglu: bool = False
    """Its ViT blocks use RMSNorm and a SwiGLU MLP (Qwen2.5-VL); the others LayerNorm and a GELU MLP."""
    deepstack: bool = False
    """Its tower feeds DeepStack maps to early language layers, each through its own merger (Qwen3-VL)."""
    gated_attention: bool = False
    """Its full attention gates its output (`q_proj` emits each head's query and gate: Qwen3.5)."""
    hybrid_attention: bool = False
    """Linear-attention (Gated DeltaNet) layers beside full attention: a recurrent state per sequence instead of KV,
    which the transformers cache carries and packing must reset per row (`is_gated_deltanet` tells the layers)."""
    thinking_template: bool = False
    """The released chat template opens `<think>` in the generation prompt when thinking is on (`data.thinking`)."""
    dense: str | None = None
    """A mixture-of-experts family's dense sibling, whose attention, tower, M-RoPE and conventions it shares: only its
    feed-forward layers differ (a router choosing top-k experts per token); None for a dense family."""
    vllm_lora: bool = False
    """vLLM has been shown to serve its LoRA adapter (the engine/trainer log-prob gap of a LoRA run measured in
    `tests/trainer/test_vllm_train.py`): `rollout.vllm.adapter_sync` null turns the adapter-only sync on."""


_QWEN2_PIXELS = dict(patch_size=14, min_pixels=56 * 56, max_pixels=16384 * 28 * 28)  # one token per 28 x 28 px
_QWEN3_PIXELS = dict(patch_size=16, min_pixels=64 * 32 * 32, max_pixels=16384 * 32 * 32)  # one token per 32 x 32 px

FAMILIES: dict[str, Family] = {
    "qwen2_vl": Family(
        model_class="Qwen2VLForConditionalGeneration",
        processor_class="Qwen2VLProcessor",
        config_class="Qwen2VLConfig",
        box_format="qwen2",
        **_QWEN2_PIXELS,
        video_timestamps=False,
    ),
    "qwen2_5_vl": Family(
        model_class="Qwen2_5_VLForConditionalGeneration",
        processor_class="Qwen2_5_VLProcessor",
        config_class="Qwen2_5_VLConfig",
        box_format="qwen2_5",
        **_QWEN2_PIXELS,
        video_timestamps=False,
        video_seconds=True,
        vision_swiglu=True,
        vllm_lora=True,
    ),
    "qwen3_vl": Family(
        model_class="Qwen3VLForConditionalGeneration",
        processor_class="Qwen3VLProcessor",
        config_class="Qwen3VLConfig",
        box_format="qwen3",
        **_QWEN3_PIXELS,
        video_timestamps=True,
        qwen3=True,
        deepstack=True,
    ),
    "qwen3_5": Family(
        model_class="Qwen3_5ForConditionalGeneration",
        processor_class="Qwen3VLProcessor",  # its released processor is Qwen3-VL's
        config_class="Qwen3_5Config",
        box_format="qwen3",
        **_QWEN3_PIXELS,
        video_timestamps=True,
        qwen3=True,
        gated_attention=True,
        hybrid_attention=True,
        thinking_template=True,
    ),
}
FAMILIES["qwen3_vl_moe"] = replace(
    FAMILIES["qwen3_vl"],
    model_class="Qwen3VLMoeForConditionalGeneration",
    config_class="Qwen3VLMoeConfig",
    dense="qwen3_vl",
)
FAMILIES["qwen3_5_moe"] = replace(
    FAMILIES["qwen3_5"],
    model_class="Qwen3_5MoeForConditionalGeneration",
    config_class="Qwen3_5MoeConfig",
    dense="qwen3_5",
)
"""Released pixel bounds (preprocessor_config.json): Qwen2-VL / Qwen2.5-VL 3,136 .. 12,845,056 px (qwen-vl-utils'
MIN_PIXELS / MAX_PIXELS; transformers' Qwen2VLImageProcessor class defaults to 1,003,520 instead, which no released
checkpoint uses), Qwen3-VL and Qwen3.5 65,536 .. 16,777,216 px."""

_MOE_NAME = re.compile(r"_a\d+b(?:_|$)|_moe(?:_|$)")
"""A mixture-of-experts checkpoint's name, normalised: qwen3_5_35b_a3b, qwen3_vl_30b_a3b_instruct."""

PROCESSOR_ARCH = {f.processor_class: arch for arch, f in reversed(FAMILIES.items()) if f.dense is None}
"""The family of each Qwen processor class: the first family that ships it (Qwen3.5 ships Qwen3-VL's, whose video and
image conventions it shares)."""

GATED_DELTANET = "linear_attention"
"""A Gated DeltaNet layer's entry in a hybrid text config's `layer_types` (the others are "full_attention")."""


def is_gated_deltanet(layer) -> bool:
    """A text decoder layer whose token mixer is Gated DeltaNet linear attention (Qwen3.5's `linear_attn`) rather than
    attention, given as the layer module or as its `layer_types` entry: the one test the planner, the linear-attention
    passes and ZeRO-3 share."""
    return layer == GATED_DELTANET if isinstance(layer, str) else hasattr(layer, "linear_attn")


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
        raise ValueError(f"model arch {arch!r} is not supported; accepted: {', '.join(FAMILIES)}")
    return FAMILIES[arch]


def arch_by_name(name: str) -> str | None:
    """The arch a hub id or model name names, else None: Qwen/Qwen2.5-VL-7B-Instruct -> qwen2_5_vl; a
    mixture-of-experts name (an `-A3B` active-parameter suffix or `moe`) names its family's MoE arch:
    Qwen/Qwen3.5-35B-A3B -> qwen3_5_moe, qwen3-vl-30b-a3b -> qwen3_vl_moe. None when no arch or several."""
    low = name.lower().replace(".", "_").replace("-", "_")  # Qwen/Qwen3.5-35B-A3B -> qwen/qwen3_5_35b_a3b
    moe = bool(_MOE_NAME.search(low))
    named = [a for a, f in FAMILIES.items() if f.dense is None and a in low]
    if moe:
        named = [a for a, f in FAMILIES.items() if f.dense in named]
    return named[0] if len(named) == 1 else None
