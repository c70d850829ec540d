"""The model `vlgrpo plan` plans while model.name_or_path is still the config default and not built: the tiny model
`vlgrpo model init-tiny` builds there. Its sizes come in as an argument: memory imports neither vlgrpo.tiny nor
vlgrpo.models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlgrpo.config import Config
from vlgrpo.memory.specs import FAMILIES, ModelSpec, PlanError


def unbuilt_default_model(cfg: Config) -> bool:
    """model.name_or_path is still the config default and nothing is built there yet (no config.json)."""
    name = cfg.model.name_or_path
    return name == Config().model.name_or_path and not (Path(name) / "config.json").is_file()


def init_tiny_spec(tiny: Any, cfg: Config) -> tuple[ModelSpec, str]:
    """The spec of the model `vlgrpo model init-tiny --out <model.name_or_path>` builds, and a note saying so.

    `tiny` is a `TinySpec` (vlgrpo.tiny), passed in by the CLI: memory imports neither vlgrpo.tiny nor
    vlgrpo.models. Its vocab_size is the BPE's target; the trained tokenizer may come out a few tokens smaller."""
    arch = "qwen2_5_vl" if cfg.model.arch == "auto" else cfg.model.arch  # init-tiny's --arch default
    if arch not in FAMILIES:
        raise PlanError(
            f"model.arch={arch}: the planner counts the parameters of {', '.join(FAMILIES)} models; "
            "plan model states with --params N"
        )
    fam = FAMILIES[arch]
    vision_mlp = tiny.vision_intermediate
    if not (fam.qwen3 or fam.vision_swiglu):  # Qwen2-VL's ViT MLP is mlp_ratio x embed_dim
        vision_mlp = tiny.vision_intermediate // tiny.vision_hidden * tiny.vision_hidden
    qwen3 = fam.qwen3  # vlgrpo.tiny's: 16 px patches, 256 learned positions
    hybrid = fam.hybrid_attention  # Gated DeltaNet in all but every full_attention_interval-th layer, no DeepStack
    linear = (
        dict(
            linear_layers=tiny.num_layers - tiny.num_layers // tiny.full_attention_interval,
            linear_k_heads=tiny.linear_num_key_heads,
            linear_v_heads=tiny.linear_num_value_heads,
            linear_k_dim=tiny.linear_key_head_dim,
            linear_v_dim=tiny.linear_value_head_dim,
        )
        if hybrid
        else {}
    )
    name = cfg.model.name_or_path
    spec = ModelSpec(
        name=name,
        family=arch,
        hidden=tiny.hidden_size,
        intermediate=tiny.intermediate_size,
        layers=tiny.num_layers,
        heads=tiny.num_heads,
        kv_heads=tiny.num_kv_heads,
        head_dim=tiny.attention_head_dim(arch),
        vocab=tiny.vocab_size,
        tie_embeddings=tiny.tie_word_embeddings,
        vision_depth=tiny.vision_depth,
        vision_hidden=tiny.vision_hidden,
        vision_intermediate=vision_mlp,
        patch=fam.patch_size,
        position_embeddings=256 if qwen3 else 0,
        deepstack_mergers=len(tiny.deepstack_visual_indexes) if fam.deepstack else 0,
        min_pixels=tiny.min_pixels,
        max_pixels=tiny.max_pixels,
        **linear,
        **(
            dict(
                experts=tiny.num_experts,
                experts_per_token=tiny.experts_per_token,
                moe_intermediate=tiny.moe_intermediate_size,
                shared_expert_intermediate=tiny.shared_expert_intermediate_size if hybrid else 0,
            )
            if fam.dense is not None
            else {}
        ),
    )
    flag = "" if arch == "qwen2_5_vl" else f" --arch {arch}"
    note = (
        f"model.name_or_path={name} (the config default) is not built yet: planned the tiny {arch} that "
        f"`vlgrpo model init-tiny --out {name}{flag}` builds there. A real model: vlgrpo plan --model "
        "qwen2.5-vl-7b --gpus 8 --lora-rank 16, or a recipe such as configs/qwen2_5_vl_7b_lora_8xa100.yaml"
    )
    return spec, note
