"""Model inputs built from cached vision features: prompt token ids, M-RoPE positions, and forward passes that inject
the features instead of `pixel_values` (for generation and for the trainer's log-prob passes). Qwen3-VL's DeepStack
maps travel with the embeddings; its own forward adds them after its first decoder layers, at the image tokens.

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

from vlgrpo.data.images import ProcessorGeometry, image_size
from vlgrpo.data.prompts import render_messages
from vlgrpo.data.video import VideoSampling, frame_timestamps, visual_sources
from vlgrpo.models import placeholder_token_ids
from vlgrpo.rollout.decode import supports_text_decoder
from vlgrpo.rollout.packed import packed_completion_logits
from vlgrpo.types import InputError, Sample

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"


@dataclass
class PromptInputs:
    """One tokenised prompt with its visual inputs; `input_ids` already hold one <|image_pad|> per image token and
    one <|video_pad|> per video token."""

    input_ids: list[int]
    mm_token_type_ids: list[int]
    """1 on image tokens, 2 on video tokens, 0 on text (the processor's convention): decides the M-RoPE positions."""
    image_grid_thw: Tensor
    """[I, 3] long: (t, h, w) in patches of each image, in `Sample.images` order (I = 0 without images)."""
    video_grid_thw: Tensor | None
    """[1, 3] long: the video's (t, h, w) in patches; None without a video."""
    sources: list
    """The visual inputs in injection order (`data.video.visual_sources`): image refs, then a VideoClip. The vision
    cache's key sources."""

    @property
    def image(self) -> str | bytes | None:
        """The one image of a one-image prompt (None otherwise)."""
        return self.sources[0] if len(self.sources) == 1 and self.video_grid_thw is None else None


def build_prompt(
    sample: Sample,
    processor,
    geometry: ProcessorGeometry | None = None,
    answer_format: str = "think_answer",
    box_format: str = "qwen2_5",
    system_prompt: str = "",
    video_sampling: VideoSampling | None = None,
) -> PromptInputs:
    """Chat-template the sample and expand its placeholders from the sizes alone (no pixel processing): each image's
    <|image_pad|> to its token count, the video's to its frames' (Qwen3-VL: one `<t seconds>` block per temporal
    patch, as Qwen's processor writes it). The same ids as `processor(text, images, videos)`; tests pin that."""
    if not sample.images and sample.video is None:
        raise InputError(f"sample '{sample.id}' has no image or video; every vlgrpo prompt carries at least one")
    geometry = geometry or ProcessorGeometry.from_processor(processor)
    sources = visual_sources(sample, video_sampling or VideoSampling())
    grids = [geometry.grid_thw(*reversed(image_size(img))) for img in sample.images]
    messages = render_messages(sample, answer_format, box_format, system_prompt)
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    wants = {IMAGE_PAD: len(grids), VIDEO_PAD: int(sample.video is not None)}
    for pad, n in wants.items():
        if text.count(pad) != n:
            hint = "" if pad == IMAGE_PAD or n == 0 else (": the checkpoint's chat template has no video part "
                                                           "(Qwen's own templates do); give it one")
            raise InputError(f"sample '{sample.id}': the chat template produced {text.count(pad)} {pad} tokens, "
                             f"expected {n}{hint}")  # fmt: skip
    pieces = text.split(IMAGE_PAD)
    text = pieces[0] + "".join(IMAGE_PAD * (gh * gw // geometry.merge_size**2) + rest
                               for (_, gh, gw), rest in zip(grids, pieces[1:]))  # fmt: skip
    video_grid = None
    if sample.video is not None:
        info = sources[-1].info()
        video_grid = info.grid_thw(geometry)
        text = _expand_video(text, info, video_grid, geometry, timestamps=writes_timestamps(processor))
    ids = processor.tokenizer(text)["input_ids"]
    image_id, video_id = processor.tokenizer.convert_tokens_to_ids([IMAGE_PAD, VIDEO_PAD])
    return PromptInputs(
        input_ids=list(ids),
        mm_token_type_ids=[1 if i == image_id else 2 if i == video_id else 0 for i in ids],
        image_grid_thw=torch.tensor(grids, dtype=torch.long).reshape(-1, 3),
        video_grid_thw=None if video_grid is None else torch.tensor([video_grid], dtype=torch.long),
        sources=sources,
    )


def writes_timestamps(processor) -> bool:
    """Qwen3-VL's processor writes each video frame's time as text (`<1.2 seconds>`); Qwen2/2.5-VL's do not."""
    return type(processor).__name__.startswith("Qwen3VL")


def _expand_video(text: str, info, grid: tuple[int, int, int], geometry: ProcessorGeometry, timestamps: bool) -> str:
    """The video's pad run: tokens per frame x temporal patches; with timestamps, the whole
    <|vision_start|><|video_pad|><|vision_end|> becomes one `<t seconds><|vision_start|>...<|vision_end|>` block per
    temporal patch (Qwen3-VL's own processor)."""
    t, gh, gw = grid
    per_frame = gh * gw // geometry.merge_size**2
    if not timestamps:
        return text.replace(VIDEO_PAD, VIDEO_PAD * (t * per_frame), 1)
    seconds = frame_timestamps(info.indices, info.source_fps, geometry.temporal_patch_size)
    blocks = "".join(f"<{s:.1f} seconds>{VISION_START}{VIDEO_PAD * per_frame}{VISION_END}" for s in seconds[:t])
    wrapped = VISION_START + VIDEO_PAD + VISION_END
    return text.replace(wrapped, blocks, 1) if wrapped in text else text.replace(VIDEO_PAD, blocks, 1)


def forbidden_mask(tokenizer, vocab_size: int, device=None) -> Tensor:
    """[V] bool: True on the vision placeholder ids, which sampling sets to -inf and the trainer masks identically."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[[i for i in placeholder_token_ids(tokenizer) if i < vocab_size]] = True
    return mask


def vocab_size(model) -> int:
    """Rows of the LM head, from the config (a ZeRO-3 partitioned weight has shape [0] outside its forward)."""
    return int(model.config.get_text_config().vocab_size)


def left_pad(rows: list[list[int]], pad_id: int, device=None) -> tuple[Tensor, Tensor]:
    """Left-pad id lists -> (ids [R, T] long, attention_mask [R, T] long)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


def core_model(model: torch.nn.Module) -> torch.nn.Module:
    """The inner Qwen-VL model that owns `get_rope_index` (through peft / DDP wrappers)."""
    for m in model.modules():
        if hasattr(m, "get_rope_index") and hasattr(m, "visual"):
            return m
    raise ValueError(f"{type(model).__name__} is not a Qwen2-VL / 2.5-VL / 3-VL model (no get_rope_index)")


def row_parts(features: list) -> list[list]:
    """Each row's (or prompt's) visual features as a list: an ImageFeatures alone is a one-image row."""
    return [list(f) if isinstance(f, (list, tuple)) else [f] for f in features]


def _grids(model, rows: list[list]) -> dict:
    """`get_rope_index`'s grid arguments for rows of features: every image's grid, then every video's, in row order
    (the order the model's placeholder runs are filled in), and Qwen2.5-VL's seconds per temporal patch."""
    flat = [f for row in rows for f in row]
    images = [f.grid_thw for f in flat if not getattr(f, "is_video", False)]
    videos = [f for f in flat if getattr(f, "is_video", False)]
    out = {"image_grid_thw": torch.stack(images).reshape(-1, 3) if images else None,
           "video_grid_thw": torch.stack([f.grid_thw for f in videos]) if videos else None}  # fmt: skip
    if videos and _takes_seconds(core_model(model)):
        tps = core_model(model).config.vision_config.temporal_patch_size
        out["second_per_grid_ts"] = torch.tensor([tps / f.video_fps for f in videos])
    return out


def _takes_seconds(core) -> bool:
    """Qwen2.5-VL spaces a video's temporal positions by seconds (`second_per_grid_ts`); Qwen2-VL by patch index,
    Qwen3-VL by the timestamps written in the text."""
    import inspect

    return "second_per_grid_ts" in inspect.signature(core.get_rope_index).parameters


def mrope_positions(model, input_ids: Tensor, attention_mask: Tensor, mm_token_type_ids: Tensor, features: list):
    """M-RoPE position ids [3, R, T] (0 on padding) and the next free position of each row [R] long; `features`:
    each row's visual features (ImageFeatures or a list of them), whose grids place the visual tokens."""
    grids = {k: (v.to(input_ids.device) if k != "second_per_grid_ts" else v) for k, v in
             _grids(model, row_parts(features)).items() if v is not None}  # fmt: skip
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
    kinds = {"image": [f for f in flat if not getattr(f, "is_video", False)],
             "video": [f for f in flat if getattr(f, "is_video", False)]}  # fmt: skip
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
            raise ValueError(f"{short} of {len(maps)} {kind}s' features lack the model's {want} DeepStack maps "
                             "(deepstack_visual_indexes): features of another model, or a cache entry without them")
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        per_layer = [list(layer) for layer in zip(*maps)]  # L lists of [N_i, H]
        out[kind] = BaseModelOutputWithDeepstackFeatures(pooler_output=embeds, deepstack_features=per_layer)
    return out


def policy_logits(
    model, input_ids: Tensor, attention_mask: Tensor, mm_token_type_ids: Tensor, features: list
) -> Tensor:
    """One forward over whole rows with injected features -> logits [R, T, V]; logits[:, t] predicts ids[:, t + 1].

    Rows may be left- or right-padded. `features` has one entry per row, in row order: the row's ImageFeatures (one
    image) or the list of its images' and video's (`visual_sources` order); a repeated image is simply listed again.
    """
    if len(features) != input_ids.shape[0]:
        raise ValueError(f"policy_logits wants one features entry per row: {input_ids.shape[0]} rows, "
                         f"{len(features)} entries")  # fmt: skip
    pos, _ = mrope_positions(model, input_ids, attention_mask, mm_token_type_ids, features)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=pos,
        mm_encoder_outputs=image_outputs(model, features),
        use_cache=False,
    )
    return out.logits


def prefill(model, prompt_ids: Tensor, prompt_mask: Tensor, mm_token_type_ids: Tensor, features: list):
    """Forward the prompts once with a KV cache -> (last-position logits [B, V], cache, next position [B])."""
    pos, next_pos = mrope_positions(model, prompt_ids, prompt_mask, mm_token_type_ids, features)
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask if not bool(prompt_mask.all()) else None,
        position_ids=pos,
        mm_encoder_outputs=image_outputs(model, features),
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

    def select(self, rows: Tensor | list[int]) -> "CompletionBatch":
        """A micro-batch of rows, keeping only the prompts they need (features: index them with `used_prompts`)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        used, inverse = torch.unique(self.row_prompt[rows], return_inverse=True)
        return CompletionBatch(
            self.prompt_ids[used], self.prompt_mask[used], self.mm_token_type_ids[used], self.completion_ids[rows],
            self.completion_mask[rows], inverse,
        )  # fmt: skip

    def used_prompts(self, rows: Tensor | list[int]) -> list[int]:
        """Indices of the prompts `select(rows)` keeps, in its order."""
        return torch.unique(self.row_prompt[torch.as_tensor(rows, dtype=torch.long)]).tolist()


def collate_groups(groups, pad_id: int, image_token_id: int, video_token_id: int | None = None,
                   device=None) -> CompletionBatch:  # fmt: skip
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
    to = lambda t: t.to(device)  # noqa: E731
    return CompletionBatch(
        to(prompt_ids), to(prompt_mask), to(mm * prompt_mask), to(ids), to(mask), to(row_prompt),
    )  # fmt: skip


def _checkpointing(model) -> bool:
    """Gradient checkpointing drops the KV cache in training mode, so the shared-prefix pass must not rely on it."""
    return model.training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def completion_logits(model, batch: CompletionBatch, features: list) -> Tensor:
    """Logits that predict each completion token -> [R, C, V] (features: one entry per prompt, B of them: its
    ImageFeatures or the list of its parts').

    Shared prefix: the prompts are forwarded once and the completions against their KV cache (the prompt is never
    recomputed per completion; gradients flow through the cache). The completion pass is `packed.py`'s, which runs
    no layer on padding, for the models it supports; else the transformers forward over the cache gathered to the R
    rows. Under active gradient checkpointing it falls back to whole rows through `policy_logits` (same numbers).
    """
    if _checkpointing(model):
        return _completion_logits_full_rows(model, batch, features)
    last, cache, next_pos = prefill(model, batch.prompt_ids, batch.prompt_mask, batch.mm_token_type_ids, features)
    if supports_text_decoder(model):
        return packed_completion_logits(model, batch.completion_ids, batch.completion_mask, batch.row_prompt,
                                        batch.prompt_mask, last, cache, next_pos)  # fmt: skip
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


def _completion_logits_full_rows(model, batch: CompletionBatch, features: list) -> Tensor:
    rp = batch.row_prompt
    ids = torch.cat([batch.prompt_ids[rp], batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask[rp], batch.completion_mask], dim=1)
    mm = torch.cat([batch.mm_token_type_ids[rp], torch.zeros_like(batch.completion_ids)], dim=1)
    logits = policy_logits(model, ids, mask, mm, [features[i] for i in rp.tolist()])
    tp = batch.prompt_ids.shape[1]
    return logits[:, tp - 1 : -1]


def completion_logprobs_and_entropy(
    model, batch: CompletionBatch, features: list, forbidden: Tensor | None, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """(log-probs [R, C], entropies [R, C]) of the completion tokens under log softmax(logits / T) with the
    forbidden (placeholder) ids at -inf: the exact distribution the HF engine samples from. Padding: mask it."""
    from vlgrpo.grpo.logprobs import token_logprobs

    logits = completion_logits(model, batch, features)
    return token_logprobs(logits, batch.completion_ids, temperature=temperature, forbidden=forbidden)


def completion_logprobs(
    model, batch: CompletionBatch, features: list, forbidden: Tensor | None, temperature: float = 1.0
) -> Tensor:
    """Log-probs [R, C] of the completion tokens (see `completion_logprobs_and_entropy`)."""
    return completion_logprobs_and_entropy(model, batch, features, forbidden, temperature)[0]
