"""The policy's forward passes with cached vision features injected instead of `pixel_values` (their inputs and the
prompts' prefill: `prefill.py`): whole-row logits and the trainer's log-prob passes over shared prompts. Knows nothing
of sampling or training. A prompt holds one image, several, or images and a video; each prompt's features are a list
in `visual_sources` order. Shapes: B prompts, G completions per prompt, R = rows (B*G or a subset), T tokens, C
completion tokens, N image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vlgrpo.policy.packed import CompletionImages, packed_completion_logits
from vlgrpo.policy.prefill import core_model, image_outputs, mrope_positions, prefill, prefill_batch, row_parts
from vlgrpo.policy.prompt import left_pad
from vlgrpo.policy.routing import BatchRouting, routed
from vlgrpo.policy.text_decoder import is_hybrid, supports_text_decoder


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
