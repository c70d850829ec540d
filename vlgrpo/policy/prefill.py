"""The prompt's pass with cached vision features injected instead of `pixel_values`: M-RoPE positions, the
`mm_encoder_outputs` the model reads, the prompts' prefill (the HF engine's generation starts from it, the update's
log-prob passes continue it), a batch's shared prefix forwarded once, and a sequence continued from its cache (a
multi-turn rollout's next turn). Every prefill keeps only the last position's logits and the cache, so its last layer
runs at the last position only (`last_position.py`). Qwen3-VL's DeepStack maps travel with the embeddings; its own
forward adds them after its first decoder layers, at the image tokens.

Every pass builds a fresh `mm_encoder_outputs` dict (generate mutates it) and passes explicit M-RoPE position ids, so
nothing depends on `model.model.rope_deltas` left by an earlier call. Shapes: B prompts, T tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.modeling_outputs import BaseModelOutputWithPooling

from vlgrpo.families import family_of
from vlgrpo.policy.causal_blocks import causal_blocks
from vlgrpo.policy.last_position import last_position_only
from vlgrpo.policy.routing import routed
from vlgrpo.policy.text_decoder import is_hybrid


def core_model(model: torch.nn.Module) -> torch.nn.Module:
    """The inner Qwen-VL model that owns `get_rope_index` (through peft / DDP wrappers)."""
    for m in model.modules():
        if hasattr(m, "get_rope_index") and hasattr(m, "visual"):
            return m
    raise ValueError(f"{type(model).__name__} is not a Qwen2-VL / 2.5-VL / 3-VL / 3.5 model (no get_rope_index)")


def row_parts(features: list) -> list[list]:
    """Each row's (or prompt's) visual features as a list: an ImageFeatures alone is a one-image row."""
    return [list(f) if isinstance(f, (list, tuple)) else [f] for f in features]


def _grids(model, rows: list[list]) -> dict:
    """`get_rope_index`'s grid arguments for rows of features: every image's grid, then every video's, in row order
    (the order the model's placeholder runs are filled in), and Qwen2.5-VL's seconds per temporal patch."""
    flat = [f for row in rows for f in row]
    images = [f.grid_thw for f in flat if not getattr(f, "is_video", False)]
    videos = [f for f in flat if getattr(f, "is_video", False)]
    out = {
        "image_grid_thw": torch.stack(images).reshape(-1, 3) if images else None,
        "video_grid_thw": torch.stack([f.grid_thw for f in videos]) if videos else None,
    }
    config = core_model(model).config
    if videos and family_of(config).video_seconds:  # Qwen2.5-VL spaces a video's temporal positions by seconds
        tps = config.vision_config.temporal_patch_size
        out["second_per_grid_ts"] = torch.tensor([tps / f.video_fps for f in videos])
    return out


def mrope_positions(model, input_ids: Tensor, attention_mask: Tensor, mm_token_type_ids: Tensor, features: list):
    """M-RoPE position ids [3, R, T] (0 on padding) and the next free position of each row [R] long; `features`:
    each row's visual features (ImageFeatures or a list of them), whose grids place the visual tokens."""
    grids = {
        k: (v.to(input_ids.device) if k != "second_per_grid_ts" else v)
        for k, v in _grids(model, row_parts(features)).items()
        if v is not None
    }
    pos, _ = core_model(model).get_rope_index(
        input_ids, mm_token_type_ids=mm_token_type_ids, attention_mask=attention_mask, **grids
    )
    return pos, pos.amax(dim=(0, 2)) + 1


def image_outputs(model, features: list) -> dict:
    """A fresh `mm_encoder_outputs` dict (transformers' generate mutates the one it is given) laid out as the model's
    own `get_image_features` / `get_video_features` return it: "image" for every image of every row, "video" for
    every video, in row order. A DeepStack model (Qwen3-VL) gets every part's maps, one list per
    `deepstack_visual_indexes` entry; features without them are refused, not run without the DeepStack layers."""
    flat = [f for row in row_parts(features) for f in row]
    kinds = {
        "image": [f for f in flat if not getattr(f, "is_video", False)],
        "video": [f for f in flat if getattr(f, "is_video", False)],
    }
    vision = core_model(model).config.vision_config
    out = {}
    for kind, feats in kinds.items():
        if not feats:
            continue
        embeds = [f.embeds if hasattr(f, "embeds") else f for f in feats]
        if not hasattr(vision, "deepstack_visual_indexes"):
            out[kind] = BaseModelOutputWithPooling(pooler_output=embeds)
            continue
        want = len(vision.deepstack_visual_indexes)
        maps = [getattr(f, "deepstack", None) for f in feats]  # [L, N_i, H] each
        short = sum(m is None or m.shape[0] != want for m in maps)
        if short:
            raise ValueError(
                f"{short} of {len(maps)} {kind}s' features lack the model's {want} DeepStack maps "
                "(deepstack_visual_indexes): features of another model, or a cache entry without them"
            )
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        per_layer = [list(layer) for layer in zip(*maps)]  # L lists of [N_i, H]
        out[kind] = BaseModelOutputWithDeepstackFeatures(pooler_output=embeds, deepstack_features=per_layer)
    return out


def prefill(model, prompt_ids: Tensor, prompt_mask: Tensor, mm_token_type_ids: Tensor, features: list):
    """Forward the prompts once with a KV cache -> (last-position logits [B, V], cache, next position [B])."""
    pos, next_pos = mrope_positions(model, prompt_ids, prompt_mask, mm_token_type_ids, features)
    with last_position_only(model), causal_blocks():
        out = model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask if not bool(prompt_mask.all()) else None,
            position_ids=pos,
            mm_encoder_outputs=image_outputs(model, features),
            use_cache=True,
            logits_to_keep=1,
        )
    return out.logits[:, -1], out.past_key_values, next_pos


SHARED_PREFIX_MIN = 256
"""Leading prompt tokens every prompt of a batch must share for the update to run them once for the batch (a long
system turn, a tools block: the zoom tool's schema is ~750 tokens of the tiny base's tokenizer, ~250 of Qwen's);
below it each prompt is prefilled whole, as before."""


def common_prefix(prompt_ids: Tensor, prompt_mask: Tensor, mm_token_type_ids: Tensor) -> int:
    """The number of leading text tokens every prompt's real tokens share (left padding skipped), leaving each prompt
    at least one token of its own."""
    rows = [ids[m.bool()] for ids, m in zip(prompt_ids, prompt_mask)]
    n = min(len(r) for r in rows) - 1
    if n <= 0:
        return 0
    same = mm_token_type_ids[0][prompt_mask[0].bool()][:n] == 0
    for r in rows[1:]:
        same &= r[:n] == rows[0][:n]
    return n if bool(same.all()) else int((~same).nonzero()[0])


def prefill_batch(
    model, prompt_ids: Tensor, prompt_mask: Tensor, mm_token_type_ids: Tensor, features: list, routing=None
):
    """`prefill` for the update -> (last-position logits [B, V], cache, next position [B], the cache's key mask).
    When the B prompts share at least SHARED_PREFIX_MIN leading tokens (`common_prefix`), those are forwarded once
    and their keys and values repeated over the prompts (gradients flow back through the repeat), then each prompt's
    own tokens continue from them: the cache holds the shared part, then each prompt's rest left-padded, and the key
    mask says which positions are real. Else the plain `prefill` (key mask = prompt_mask). A hybrid model (Qwen3.5)
    is prefilled whole: its Gated DeltaNet states would run over the padding between the two parts, and so is a
    batch with `routing` (a MoE rollout's experts, `policy.routing.BatchRouting`: replayed or compared token by
    token, in the prompts' own layout)."""
    b, tp = prompt_ids.shape
    p = common_prefix(prompt_ids, prompt_mask, mm_token_type_ids) if b > 1 else 0
    if p < SHARED_PREFIX_MIN or is_hybrid(model) or routing is not None:
        recorded = None if routing is None or routing.prompt is None else routing.prompt.flatten(0, 1)
        with routed(model, routing, recorded, prompt_mask):
            last, cache, next_pos = prefill(model, prompt_ids, prompt_mask, mm_token_type_ids, features)
        return last, cache, next_pos, prompt_mask
    real = prompt_mask.sum(1)
    start = tp - int(real[0])
    prefix = prompt_ids[0, start : start + p]
    positions = torch.arange(p, device=prompt_ids.device).view(1, 1, p).expand(3, 1, p)
    with last_position_only(model), causal_blocks():
        cache = model(input_ids=prefix[None], position_ids=positions, use_cache=True, logits_to_keep=1).past_key_values
    cache.batch_repeat_interleave(b)
    own = real - p  # [B] each prompt's tokens after the shared part: the last `own` columns of its left-padded row
    width = int(own.max())
    rest = prompt_ids[:, tp - width :]
    cols = torch.arange(width, device=prompt_ids.device)
    rest_mask = prompt_mask[:, tp - width :] * (cols[None] >= (width - own)[:, None]).long()
    key_mask = torch.cat([prompt_mask.new_ones(b, p), rest_mask], dim=1)
    ids = torch.cat([prefix.expand(b, p), rest], dim=1)
    mm = torch.cat([mm_token_type_ids.new_zeros(b, p), mm_token_type_ids[:, tp - width :] * rest_mask], dim=1)
    pos, next_pos = mrope_positions(model, ids, key_mask, mm, features)
    with last_position_only(model), causal_blocks():
        out = model(
            input_ids=rest,
            attention_mask=key_mask,
            position_ids=pos[:, :, p:],
            past_key_values=cache,
            mm_encoder_outputs=image_outputs(model, features),
            use_cache=True,
            logits_to_keep=1,
        )
    return out.logits[:, -1], out.past_key_values, next_pos, key_mask


def extend(model, cache, ids: Tensor, done: int, features: list):
    """Continue one sequence whose first `done` tokens are in `cache` (batch 1): forward ids[:, done:] -> (last-position
    logits [1, V], the cache over all of `ids`, next position [1]). `features`: every image of the sequence in order
    (their grids place the M-RoPE positions of the whole sequence); those whose pads lie after `done` are injected."""
    image_id = core_model(model).config.image_token_id
    mm = (ids == image_id).long()
    pos, next_pos = mrope_positions(model, ids, torch.ones_like(ids), mm, [features])
    tail = ids[0, done:]
    runs = int(((tail == image_id) & torch.cat([tail.new_ones(1, dtype=torch.bool), tail[:-1] != image_id])).sum())
    new = list(features)[len(features) - runs :] if runs else []
    with last_position_only(model), causal_blocks():
        out = model(
            input_ids=ids[:, done:],
            position_ids=pos[:, :, done:],
            past_key_values=cache,
            **({"mm_encoder_outputs": image_outputs(model, [new])} if new else {}),
            use_cache=True,
            logits_to_keep=1,
        )
    return out.logits[:, -1], out.past_key_values, next_pos
