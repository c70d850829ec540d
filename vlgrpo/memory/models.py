"""The released checkpoints' architecture numbers (a built-in table) and a local HF `config.json` read into a
`ModelSpec`: where the planner's model comes from. Pure arithmetic: no torch, no weights.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from vlgrpo.families import FAMILIES, GATED_DELTANET, is_gated_deltanet
from vlgrpo.memory.specs import ModelSpec, PlanError


def _qwen2_5(name, hidden, inter, layers, heads, kv, vocab, tie, vis_inter=3420) -> ModelSpec:
    return ModelSpec(
        name, "qwen2_5_vl", hidden, inter, layers, heads, kv, hidden // heads, vocab, tie, vision_intermediate=vis_inter
    )


def _qwen2(name, hidden, inter, layers, heads, kv, vocab, tie) -> ModelSpec:
    return ModelSpec(
        name, "qwen2_vl", hidden, inter, layers, heads, kv, hidden // heads, vocab, tie, vision_intermediate=4 * 1280
    )  # mlp_ratio 4 x embed_dim 1280


def _qwen3(name, hidden, inter, layers, heads, kv, tie, vision, deepstack) -> ModelSpec:
    """A dense Qwen3-VL: head_dim 128 and vocabulary 151,936 in every size; 16 px patches and 2,304 learned positions in
    the tower (its pixel bounds: `vlgrpo.families`). `vision` is (depth, hidden, intermediate)."""
    depth, hv, iv = vision
    return ModelSpec(
        name,
        "qwen3_vl",
        hidden,
        inter,
        layers,
        heads,
        kv,
        128,
        151936,
        tie,
        vision_depth=depth,
        vision_hidden=hv,
        vision_intermediate=iv,
        patch=16,
        position_embeddings=2304,
        deepstack_mergers=len(deepstack),
    )


def _qwen3_5(name, hidden, inter, layers, heads, kv, linear_v_heads, tie, vision) -> ModelSpec:
    """A dense Qwen3.5: head_dim 256 (a quarter rotated), vocabulary 248,320, Gated DeltaNet in 3 of every 4 layers
    with 16 key heads of 128 and `linear_v_heads` value heads of 128, conv kernel 4; Qwen3-VL's tower (16 px, 2,304
    learned positions) without DeepStack. `vision` is (depth, hidden, intermediate)."""
    depth, hv, iv = vision
    return ModelSpec(
        name,
        "qwen3_5",
        hidden,
        inter,
        layers,
        heads,
        kv,
        256,
        248320,
        tie,
        vision_depth=depth,
        vision_hidden=hv,
        vision_intermediate=iv,
        patch=16,
        position_embeddings=2304,
        linear_layers=layers * 3 // 4,
        linear_k_heads=16,
        linear_v_heads=linear_v_heads,
        linear_k_dim=128,
        linear_v_dim=128,
    )


def _moe(dense: ModelSpec, experts: int, top_k: int, width: int, shared: int = 0) -> ModelSpec:
    """A mixture-of-experts sibling of a dense spec: every layer's MLP is `experts` routed experts of `width` (top-k per
    token), with a gated shared expert of `shared` (Qwen3.5-MoE)."""
    family = next(a for a, f in FAMILIES.items() if f.dense == dense.family)
    return dataclasses.replace(
        dense,
        family=family,
        experts=experts,
        experts_per_token=top_k,
        moe_intermediate=width,
        shared_expert_intermediate=shared,
    )


# Public config.json values of the released checkpoints. Qwen3-VL (docs/memory.md names the sources): transformers'
# Qwen3VLConfig defaults are none of them (its text defaults are 32 layers x 4096 with intermediate 22016).
MODEL_TABLE: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        _qwen2("Qwen/Qwen2-VL-2B-Instruct", 1536, 8960, 28, 12, 2, 151936, True),
        _qwen2("Qwen/Qwen2-VL-7B-Instruct", 3584, 18944, 28, 28, 4, 152064, False),
        _qwen2_5("Qwen/Qwen2.5-VL-3B-Instruct", 2048, 11008, 36, 16, 2, 151936, True),
        _qwen2_5("Qwen/Qwen2.5-VL-7B-Instruct", 3584, 18944, 28, 28, 4, 152064, False),
        _qwen2_5("Qwen/Qwen2.5-VL-32B-Instruct", 5120, 27648, 64, 40, 8, 152064, False, vis_inter=3456),
        _qwen2_5("Qwen/Qwen2.5-VL-72B-Instruct", 8192, 29568, 80, 64, 8, 152064, False, vis_inter=3456),
        _qwen3("Qwen/Qwen3-VL-2B-Instruct", 2048, 6144, 28, 16, 8, True, (24, 1024, 4096), (5, 11, 17)),
        _qwen3("Qwen/Qwen3-VL-4B-Instruct", 2560, 9728, 36, 32, 8, True, (24, 1024, 4096), (5, 11, 17)),
        _qwen3("Qwen/Qwen3-VL-8B-Instruct", 4096, 12288, 36, 32, 8, False, (27, 1152, 4304), (8, 16, 24)),
        _qwen3("Qwen/Qwen3-VL-32B-Instruct", 5120, 25600, 64, 64, 8, False, (27, 1152, 4304), (8, 16, 24)),
        _qwen3_5("Qwen/Qwen3.5-0.8B", 1024, 3584, 24, 8, 2, 16, True, (12, 768, 3072)),
        _qwen3_5("Qwen/Qwen3.5-2B", 2048, 6144, 24, 8, 2, 16, True, (24, 1024, 4096)),
        _qwen3_5("Qwen/Qwen3.5-4B", 2560, 9216, 32, 16, 4, 32, True, (24, 1024, 4096)),
        _qwen3_5("Qwen/Qwen3.5-9B", 4096, 12288, 32, 16, 4, 32, False, (27, 1152, 4304)),
        _qwen3_5("Qwen/Qwen3.5-27B", 5120, 17408, 64, 24, 4, 48, False, (27, 1152, 4304)),
        _moe(
            _qwen3("Qwen/Qwen3-VL-30B-A3B-Instruct", 2048, 6144, 48, 32, 4, False, (27, 1152, 4304), (8, 16, 24)),
            experts=128,
            top_k=8,
            width=768,
        ),
        _moe(
            _qwen3_5("Qwen/Qwen3.5-35B-A3B", 2048, 0, 40, 16, 2, 32, False, (27, 1152, 4304)),
            experts=256,
            top_k=8,
            width=512,
            shared=512,
        ),
    )
}


def _short(name: str) -> str:
    n = name.lower().strip().removeprefix("qwen/")
    return n.removesuffix("-instruct")


def spec_from_config_json(path: str | Path) -> ModelSpec:
    """Read a Qwen2-VL / Qwen2.5-VL / Qwen3-VL HF config.json (text keys under `text_config` or at the top level)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PlanError(f"cannot read model config '{path}': {e}") from None
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise PlanError(f"'{path}': model_type {family!r} is not supported; accepted: {', '.join(FAMILIES)}")
    text, vis = {**raw, **(raw.get("text_config") or {})}, raw.get("vision_config") or {}

    def need(d: dict, key: str, where: str) -> Any:
        if key not in d:
            raise PlanError(f"'{path}' has no {where}{key}; the planner needs it to count parameters")
        return d[key]

    heads = need(text, "num_attention_heads", "")
    hidden = need(text, "hidden_size", "")
    if family == "qwen2_vl":
        hv = need(vis, "embed_dim", "vision_config.")
        iv = int(hv * vis.get("mlp_ratio", 4))
    else:
        hv, iv = need(vis, "hidden_size", "vision_config."), need(vis, "intermediate_size", "vision_config.")
    traits = FAMILIES[family]
    moe = {}
    if traits.dense is not None:  # routed experts in every layer (Qwen3.5-MoE: beside a gated shared expert)
        moe = dict(
            experts=need(text, "num_experts", ""),
            experts_per_token=need(text, "num_experts_per_tok", ""),
            moe_intermediate=need(text, "moe_intermediate_size", ""),
            shared_expert_intermediate=text.get("shared_expert_intermediate_size", 0) if traits.hybrid_attention else 0,
        )
    # transformers ties Qwen3-VL's and Qwen3.5's lm_head by the top-level key only (the released files set both alike)
    tie = raw.get("tie_word_embeddings", False) if traits.qwen3 else text.get("tie_word_embeddings", False)
    return ModelSpec(
        name=str(path.parent),
        family=family,
        hidden=hidden,
        intermediate=text.get("intermediate_size", 0) if moe else need(text, "intermediate_size", ""),
        layers=need(text, "num_hidden_layers", ""),
        heads=heads,
        kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or (128 if traits.qwen3 else hidden // heads),
        vocab=need(text, "vocab_size", ""),
        tie_embeddings=bool(tie),
        vision_depth=need(vis, "depth", "vision_config."),
        vision_hidden=hv,
        vision_intermediate=iv,
        patch=vis.get("patch_size", traits.patch_size),
        merge=vis.get("spatial_merge_size", 2),
        temporal_patch=vis.get("temporal_patch_size", 2),
        in_channels=vis.get("in_channels", vis.get("in_chans", 3)),
        position_embeddings=vis.get("num_position_embeddings", 2304) if traits.qwen3 else 0,
        deepstack_mergers=len(vis.get("deepstack_visual_indexes", (8, 16, 24))) if traits.deepstack else 0,
        **(_linear_attention(text) if traits.hybrid_attention else {}),
        **moe,
    )


def _linear_attention(text: dict) -> dict:
    """Qwen3.5's Gated DeltaNet numbers from its text config (transformers' defaults where a key is absent)."""
    layers = text["num_hidden_layers"]
    interval = text.get("full_attention_interval", 4)
    types = text.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else GATED_DELTANET for i in range(layers)
    ]
    return dict(
        linear_layers=sum(map(is_gated_deltanet, types)),
        linear_k_heads=text.get("linear_num_key_heads", 16),
        linear_v_heads=text.get("linear_num_value_heads", 32),
        linear_k_dim=text.get("linear_key_head_dim", 128),
        linear_v_dim=text.get("linear_value_head_dim", 128),
        conv_kernel=text.get("linear_conv_kernel_dim", 4),
    )


def resolve_model(name_or_path: str) -> ModelSpec:
    """A directory with config.json (or the file), else a table name like `qwen2.5-vl-7b` or `qwen3-vl-8b` (any case,
    -Instruct optional)."""
    p = Path(name_or_path)
    if p.is_dir() and (p / "config.json").is_file():
        return spec_from_config_json(p / "config.json")
    if p.is_file() and p.name.endswith(".json"):
        return spec_from_config_json(p)
    by_short = {_short(k): v for k, v in MODEL_TABLE.items()}
    if _short(name_or_path) in by_short:
        return by_short[_short(name_or_path)]
    raise PlanError(
        f"model '{name_or_path}' is neither a directory holding config.json nor a known model; known: "
        f"{', '.join(MODEL_TABLE)} (short forms like qwen2.5-vl-7b work too), or plan with --params N"
    )
