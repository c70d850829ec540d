"""The policy's forward passes with cached vision features injected instead of `pixel_values`: M-RoPE positions,
whole-row logits, the prompt's prefill (the HF engine's generation starts from it) and the trainer's log-prob passes
over shared prompts. Qwen3-VL's DeepStack maps travel with the embeddings; its own forward adds them after its first
decoder layers, at the image tokens.

Every pass builds a fresh `mm_encoder_outputs` dict (generate mutates it) and passes explicit M-RoPE position ids, so
nothing depends on `model.model.rope_deltas` left by an earlier call. Knows nothing of sampling or training.
A prompt holds one image, several, or images and a video; each prompt's features are a list in `visual_sources`
order. Shapes: B prompts, G completions per prompt, R = rows (B*G or a subset), T tokens, C completion tokens, N
image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers.modeling_outputs import BaseModelOutputWithPooling

from vlgrpo.families import family_of
from vlgrpo.policy.last_position import last_position_only
from vlgrpo.policy.packed import CompletionImages, packed_completion_logits
from vlgrpo.policy.prompt import left_pad
from vlgrpo.policy.routing import BatchRouting, routed
from vlgrpo.policy.text_decoder import is_hybrid, supports_text_decoder


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


def policy_logits(
    model, input_ids: Tensor, attention_mask: Tensor, mm_token_type_ids: Tensor, features: list, keep: int = 0
) -> Tensor:
    """One forward over whole rows with injected features -> logits [R, T, V]; logits[:, t] predicts ids[:, t + 1].
    With `keep` > 0 only the last `keep` positions go through the LM head -> [R, keep, V] (transformers'
    `logits_to_keep`): the hidden states of the others are never turned into vocabulary-sized logits.

    Rows may be left- or right-padded. `features` has one entry per row, in row order: the row's ImageFeatures (one
    image) or the list of its images' and video's (`visual_sources` order); a repeated image is simply listed again.
    """
    if len(features) != input_ids.shape[0]:
        raise ValueError(
            f"policy_logits wants one features entry per row: {input_ids.shape[0]} rows, {len(features)} entries"
        )
    pos, _ = mrope_positions(model, input_ids, attention_mask, mm_token_type_ids, features)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=pos,
        mm_encoder_outputs=image_outputs(model, features),
        use_cache=False,
        logits_to_keep=keep,
    )
    return out.logits


def prefill(model, prompt_ids: Tensor, prompt_mask: Tensor, mm_token_type_ids: Tensor, features: list):
    """Forward the prompts once with a KV cache -> (last-position logits [B, V], cache, next position [B])."""
    pos, next_pos = mrope_positions(model, prompt_ids, prompt_mask, mm_token_type_ids, features)
    with last_position_only(model):
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
    with last_position_only(model):
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
    with last_position_only(model):
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
    with last_position_only(model):
        out = model(
            input_ids=ids[:, done:],
            position_ids=pos[:, :, done:],
            past_key_values=cache,
            **({"mm_encoder_outputs": image_outputs(model, [new])} if new else {}),
            use_cache=True,
            logits_to_keep=1,
        )
    return out.logits[:, -1], out.past_key_values, next_pos


# ---------------------------------------------------------------- log-prob passes over shared prompts


@dataclass
class CompletionBatch:
    """Completions of B prompts for a shared-prefix forward: each prompt is run once, its KV cache gathered per row."""

    prompt_ids: Tensor  # [B, Tp] long, left-padded
    prompt_mask: Tensor  # [B, Tp] long
    mm_token_type_ids: Tensor  # [B, Tp] long: 1 image, 2 video, 0 text
    completion_ids: Tensor  # [R, C] long, right-padded
    completion_mask: Tensor  # [R, C] long, 1 on real completion tokens
    row_prompt: Tensor  # [R] long: index into the B prompts of each row
    tool_mask: Tensor | None = None
    """[R, C] long, 1 on tokens a tool-response turn inserted (multi-turn rollouts); None: none."""
    row_images: list | None = None
    """Per row, the features of the images its tools returned (crops), in the order of their pads in the
    completion; None: no row holds one. The packed pass takes them after the shared prompt (`completion_images`)."""
    routing: BatchRouting | None = None
    """A mixture-of-experts rollout's recorded experts (`policy.routing`), replayed or compared by every pass."""

    def select(self, rows: Tensor | list[int]) -> CompletionBatch:
        """A micro-batch of rows, keeping only the prompts they need (features: index them with `used_prompts`)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        used, inverse = torch.unique(self.row_prompt[rows], return_inverse=True)
        return CompletionBatch(
            self.prompt_ids[used],
            self.prompt_mask[used],
            self.mm_token_type_ids[used],
            self.completion_ids[rows],
            self.completion_mask[rows],
            inverse,
            None if self.tool_mask is None else self.tool_mask[rows],
            None if self.row_images is None else [self.row_images[i] for i in rows.tolist()],
            None if self.routing is None else self.routing.select(used, rows),
        )

    def used_prompts(self, rows: Tensor | list[int]) -> list[int]:
        """Indices of the prompts `select(rows)` keeps, in its order."""
        return torch.unique(self.row_prompt[torch.as_tensor(rows, dtype=torch.long)]).tolist()


def collate_groups(
    groups, pad_id: int, image_token_id: int, video_token_id: int | None = None, device=None
) -> CompletionBatch:
    """RolloutGroups (B prompts x G_b completions) -> CompletionBatch. The visual grids travel with the features
    (one entry per prompt), which every pass takes beside the batch."""
    prompt_ids, prompt_mask = left_pad([g.prompt_ids for g in groups], pad_id)
    rows = [c.token_ids for g in groups for c in g.completions]
    width = max(1, max((len(r) for r in rows), default=1))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    row_prompt = torch.tensor([b for b, g in enumerate(groups) for _ in g.completions], dtype=torch.long)
    mm = (prompt_ids == image_token_id).long()  # the processor's mm_token_type_ids: 1 image, 2 video, 0 text
    if video_token_id is not None:
        mm += 2 * (prompt_ids == video_token_id).long()
    tool = None
    masks = [c.tool_mask for g in groups for c in g.completions]
    if any(m is not None for m in masks):  # multi-turn rows: the tool-response turns' tokens
        tool = torch.zeros_like(ids)
        for i, m in enumerate(masks):
            if m is not None:
                tool[i, : len(m)] = torch.tensor(m, dtype=torch.long)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return CompletionBatch(
        to(prompt_ids),
        to(prompt_mask),
        to(mm * prompt_mask),
        to(ids),
        to(mask),
        to(row_prompt),
        to(tool),
    )


def _checkpointing(model) -> bool:
    """Gradient checkpointing drops the KV cache in training mode, so the shared-prefix pass must not rely on it."""
    return model.training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def completion_logits(model, batch: CompletionBatch, features: list, prefilled=None) -> Tensor:
    """Logits that predict each completion token -> [R, C, V] (features: one entry per prompt, B of them: its
    ImageFeatures or the list of its parts').

    Shared prefix: the prompts are forwarded once and the completions against their KV cache (the prompt is never
    recomputed per completion; gradients flow through the cache). The completion pass is `packed.py`'s, which runs
    no layer on padding, for the models it supports; else the transformers forward over the cache gathered to the R
    rows. Under active gradient checkpointing it falls back to whole rows through `policy_logits` (same numbers), as
    does a hybrid model (Qwen3.5) the packed pass does not run: transformers' cache cannot gather its linear-attention
    states per row.

    `prefilled`: the prompts' prefill done already, `prefill_batch`'s outputs (the rollout's, `policy.kept_prefill`),
    for the packed pass.
    """
    crops = batch.row_images is not None and any(batch.row_images)
    packed = supports_text_decoder(model) and not _checkpointing(model)
    if prefilled is not None and not packed:
        raise ValueError(
            "a kept prefill is read by the packed completion pass only (a supported model, no checkpointing)"
        )
    if _checkpointing(model) or (not supports_text_decoder(model) and (crops or is_hybrid(model))):
        return _completion_logits_full_rows(model, batch, features)  # transformers' linear-attention cache has no
        # per-row select; its forward over a gathered cache is not given crops
    if supports_text_decoder(model):
        last, cache, next_pos, keys = (
            prefilled
            if prefilled is not None
            else prefill_batch(
                model, batch.prompt_ids, batch.prompt_mask, batch.mm_token_type_ids, features, batch.routing
            )
        )
        recorded = None  # the packed tokens' rollout experts, in the packed order (row-major over the inputs)
        if batch.routing is not None and batch.routing.completion is not None:
            recorded = batch.routing.completion[batch.completion_mask[:, 1:].bool().nonzero(as_tuple=True)]
        with routed(model, batch.routing, recorded):
            return packed_completion_logits(
                model,
                batch.completion_ids,
                batch.completion_mask,
                batch.row_prompt,
                keys,
                last,
                cache,
                next_pos,
                completion_images(model, batch, features) if crops else None,
            )
    last, cache, next_pos = prefill(model, batch.prompt_ids, batch.prompt_mask, batch.mm_token_type_ids, features)
    cache.batch_select_indices(batch.row_prompt)
    r, c = batch.completion_ids.shape
    pos = next_pos[batch.row_prompt].unsqueeze(1) + torch.arange(c, device=next_pos.device)  # [R, C]
    mask = torch.cat([batch.prompt_mask[batch.row_prompt], batch.completion_mask], dim=1)
    out = model(
        input_ids=batch.completion_ids,
        attention_mask=mask,
        position_ids=pos.unsqueeze(0).expand(3, r, c),
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([last[batch.row_prompt].unsqueeze(1), out.logits[:, :-1]], dim=1)


def _whole_rows(model, batch: CompletionBatch, features: list) -> tuple[Tensor, Tensor, Tensor, list]:
    """Each row as one sequence, prompt then completion -> (ids, mask, mm_token_type_ids [R, Tp + C], the row's
    features): a completion's crops (tool-response turns) are images of the row after its prompt's, their pads image
    tokens, so M-RoPE runs over the whole interleaved sequence."""
    rp = batch.row_prompt
    ids = torch.cat([batch.prompt_ids[rp], batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask[rp], batch.completion_mask], dim=1)
    rows = [features[i] for i in rp.tolist()]
    crops = torch.zeros_like(batch.completion_ids)
    if batch.row_images is not None:
        rows = [parts + list(extra) for parts, extra in zip(row_parts(rows), batch.row_images)]
        image_id = core_model(model).config.image_token_id
        crops = (batch.completion_ids == image_id).long() * batch.completion_mask
    return ids, mask, torch.cat([batch.mm_token_type_ids[rp], crops], dim=1), rows


def completion_images(model, batch: CompletionBatch, features: list) -> CompletionImages:
    """The crops inside a batch's completions for the packed pass: their embeddings and DeepStack maps in pad order,
    and the completion tokens' M-RoPE positions from the whole rows' grids (a crop shifts the text after it)."""
    ids, mask, mm, rows = _whole_rows(model, batch, features)
    pos, _ = mrope_positions(model, ids, mask, mm, rows)
    crops = [f for extra in batch.row_images for f in extra]
    maps = [f.deepstack for f in crops]
    deepstack = None if any(m is None for m in maps) else list(torch.cat(maps, dim=1))
    return CompletionImages(
        pos[:, :, batch.prompt_ids.shape[1] :],
        torch.cat([f.embeds for f in crops]),
        deepstack,
        core_model(model).config.image_token_id,
    )


def _completion_logits_full_rows(model, batch: CompletionBatch, features: list) -> Tensor:
    """Each row's prompt and completion forwarded whole (`_whole_rows`)."""
    ids, mask, mm, rows = _whole_rows(model, batch, features)
    tp = batch.prompt_ids.shape[1]
    recorded = None
    if batch.routing is not None and batch.routing.prompt is not None:  # each row's prompt's experts, then its own
        recorded = torch.cat([batch.routing.prompt[batch.row_prompt], batch.routing.completion], dim=1).flatten(0, 1)
    # the last prompt position predicts the first completion token: C + 1 positions through the LM head, not T
    with routed(model, batch.routing, recorded, mask):
        logits = policy_logits(model, ids, mask, mm, rows, keep=ids.shape[1] - tp + 1)
    return logits[:, :-1]


def completion_logprobs_and_entropy(
    model, batch: CompletionBatch, features: list, forbidden: Tensor | None, temperature: float = 1.0, prefilled=None
) -> tuple[Tensor, Tensor]:
    """(log-probs [R, C], entropies [R, C]) of the completion tokens under log softmax(logits / T) with the
    forbidden (placeholder) ids at -inf: the exact distribution the HF engine samples from. Padding: mask it.
    Tool-response tokens are scored as `scored_ids` says. `prefilled`: as `completion_logits` takes it."""
    from vlgrpo.grpo.logprobs import token_logprobs

    logits = completion_logits(model, batch, features, prefilled)
    return token_logprobs(logits, scored_ids(batch), temperature=temperature, forbidden=forbidden)


def scored_ids(batch: CompletionBatch) -> Tensor:
    """[R, C] the completion ids every log-prob pass scores: a tool-response turn's tokens (its crop's placeholders
    among them, forbidden ids at -inf) read as id 0, a finite value the loss masks out. The update, old-log-prob and
    engine-comparison passes all score these, so a masked -inf never meets a ratio (0 * inf = NaN)."""
    if batch.tool_mask is None:
        return batch.completion_ids
    return batch.completion_ids.masked_fill(batch.tool_mask > 0, 0)


def completion_logprobs(
    model, batch: CompletionBatch, features: list, forbidden: Tensor | None, temperature: float = 1.0
) -> Tensor:
    """Log-probs [R, C] of the completion tokens (see `completion_logprobs_and_entropy`)."""
    return completion_logprobs_and_entropy(model, batch, features, forbidden, temperature)[0]
