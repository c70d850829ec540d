"""What a vLLM request carries for one prompt (pure helpers of `engine.py`; vllm itself is not imported).

vLLM expands every vision placeholder itself, so a request holds our token ids with each image's pad run collapsed to
ONE `<|image_pad|>` and the video's to what vLLM replaces: one `<|video_pad|>` (Qwen2/2.5-VL; Qwen3-VL under
transformers >= 5.10, whose processor keeps the template's `<|vision_start|>`/`<|vision_end|>` and writes the
`<t seconds>` blocks in place of the pad), or the whole `<|vision_start|><|video_pad|><|vision_end|>` (Qwen3-VL with
an older processor, which replaces the triple). Either way vLLM's expansion gives back exactly our ids (the engine
checks the expanded length of every output, the vLLM tests the ids token for token).

The visual parts travel as our cached embeddings (`embeds`: every image's in one `image_embeds` tensor with its
`image_grid_thw` rows; the video's in `video_embeds` with `video_grid_thw` and, for Qwen3-VL, the timestamps its
prompt update writes; DeepStack maps concatenated after the embeddings) or as pixels (`pixels`: PIL images, the
video's frames already at the model's size with the metadata vLLM's processor reads its timestamps and Qwen2.5-VL's
seconds per temporal patch from).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vlgrpo.config.validate import MM_LIMIT_KEY as LIMIT_KEY
from vlgrpo.data.images import image_sha256, load_image
from vlgrpo.data.video import VideoClip, frame_timestamps
from vlgrpo.families import family_of
from vlgrpo.policy.prompt import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, PromptInputs, writes_timestamps
from vlgrpo.types import InputError

MM_INPUTS = ("embeds", "pixels")
ONE_IMAGE = {"image": 1, "video": 0}
"""`VLLMEngine.launch`'s limits when none are given: one image per prompt, nothing more profiled."""


@dataclass(frozen=True)
class PlaceholderFormat:
    """The model's vision tokens and how vLLM expands them, read once from the processor."""

    image_token_id: int
    video_token_id: int | None = None
    vision_start_id: int | None = None
    vision_end_id: int | None = None
    timestamps: bool = False
    """Qwen3-VL: a video is written as one `<t seconds><|vision_start|>pads<|vision_end|>` block per temporal patch."""
    video_triple: bool = False
    """Qwen3-VL with a processor that replaces the whole `<|vision_start|><|video_pad|><|vision_end|>` (transformers <
    5.10); False: vLLM replaces the bare `<|video_pad|>` and keeps the template's pair around the blocks."""
    seconds_per_patch: bool = False
    """Qwen2.5-VL: a video's temporal positions are spaced by its `second_per_grid_ts`."""
    temporal_patch_size: int = 2
    deepstack_maps: int = 0
    """DeepStack maps each part's embeddings carry (Qwen3-VL: len(deepstack_visual_indexes); else 0)."""
    tokenizer: object = None
    """Tokenises the `<t seconds>` text of a Qwen3-VL video block (as vLLM does, each on its own)."""

    @classmethod
    def from_processor(cls, processor, temporal_patch_size: int = 2, deepstack_maps: int = 0) -> PlaceholderFormat:
        """The format of `processor`'s model (`deepstack_maps`: the model's DeepStack map count)."""
        from transformers import ProcessorMixin

        tok = processor.tokenizer
        image, video, start, end = tok.convert_tokens_to_ids([IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END])
        qwen3 = writes_timestamps(processor)
        replaces_pad = getattr(type(processor), "replace_video_token", None) is not getattr(
            ProcessorMixin, "replace_video_token", None
        )  # vLLM's own test of the processor
        return cls(
            image_token_id=image,
            video_token_id=video,
            vision_start_id=start,
            vision_end_id=end,
            timestamps=qwen3,
            video_triple=qwen3 and not replaces_pad,
            seconds_per_patch=family_of(processor).video_seconds,
            temporal_patch_size=temporal_patch_size,
            deepstack_maps=deepstack_maps,
            tokenizer=tok,
        )

    def timestamp_ids(self, seconds: float) -> list[int]:
        return list(self.tokenizer.encode(f"<{seconds:.1f} seconds>", add_special_tokens=False))


# ---------------------------------------------------------------- limits


def mm_counts(prompt: PromptInputs) -> dict[str, int]:
    """How many images and videos a prompt holds."""
    return {"image": int(prompt.image_grid_thw.shape[0]), "video": int(prompt.video_grid_thw is not None)}


def check_prompt_limits(sample_id: str, prompt: PromptInputs, limits: dict[str, int]) -> None:
    """An InputError naming the sample and the key when the prompt holds more parts than vLLM was launched for
    (vLLM would refuse the whole batch)."""
    over = {m: n for m, n in mm_counts(prompt).items() if n > limits.get(m, 0)}
    if over:
        have = ", ".join(f"{n} {m}{'s' if n > 1 else ''}" for m, n in over.items())
        raise InputError(
            f"sample '{sample_id}' holds {have}, above {LIMIT_KEY}={limits}: raise the limit (vLLM "
            "profiles memory for that many parts per prompt) or drop the row"
        )


# ---------------------------------------------------------------- prompt ids


def engine_prompt_ids(input_ids: list[int], image_token_id: int) -> list[int]:
    """Our prompt ids with every run of image pads collapsed to ONE pad: vLLM expands each placeholder to the image's
    token count itself, so an already expanded run would be expanded again (a 16-token image became 16 x 16)."""
    return _collapse_runs(input_ids, image_token_id)


def _collapse_runs(ids: list[int], token: int) -> list[int]:
    out: list[int] = []
    for i in ids:
        if not (i == token and out and out[-1] == token):
            out.append(i)
    return out


def request_prompt_ids(prompt: PromptInputs, fmt: PlaceholderFormat) -> list[int]:
    """The ids vLLM is sent: one pad per image, the video in the form vLLM replaces (see the module docstring)."""
    ids = engine_prompt_ids(prompt.input_ids, fmt.image_token_id)
    if prompt.video_grid_thw is None:
        return ids
    if not fmt.timestamps:
        return _collapse_runs(ids, fmt.video_token_id)
    first, last = ids.index(fmt.video_token_id), len(ids) - 1 - ids[::-1].index(fmt.video_token_id)
    stamp = fmt.timestamp_ids(video_timestamps(prompt.sources[-1], fmt)[0])
    start = first - 1 - len(stamp)
    if ids[first - 1] != fmt.vision_start_id or ids[start : first - 1] != stamp or ids[last + 1] != fmt.vision_end_id:
        raise ValueError(
            "a Qwen3-VL video prompt without its `<t seconds><|vision_start|>...<|vision_end|>` blocks "
            "(not built by policy.prompt.build_prompt?)"
        )
    video = [fmt.vision_start_id, fmt.video_token_id, fmt.vision_end_id] if fmt.video_triple else [fmt.video_token_id]
    return ids[:start] + video + ids[last + 2 :]


def video_timestamps(clip: VideoClip, fmt: PlaceholderFormat) -> list[float]:
    """Seconds of each temporal patch, as Qwen3-VL writes them (`data.video.frame_timestamps`)."""
    info = clip.info()
    return frame_timestamps(info.indices, info.source_fps, fmt.temporal_patch_size)


# ---------------------------------------------------------------- visual parts


def vllm_embeds(features) -> Tensor:
    """One part's embeddings as vLLM takes them: [N, H] merged embeddings, or for a DeepStack tower (Qwen3-VL) the
    [L, N, H] maps concatenated after them along the hidden dimension, [N, (1 + L) * H] — the layout vLLM's own tower
    returns and `Qwen3VLForConditionalGeneration._compute_deepstack_embeds` splits again (main, then map 0, 1, ...).
    Sent without its maps, a Qwen3-VL part fails inside vLLM's engine core (`torch.split`: "split_sizes to sum
    exactly to H"); `build_request` refuses it first."""
    if features.deepstack is None:
        return features.embeds
    maps = features.deepstack.to(features.embeds.dtype)  # [L, N, H]
    return torch.cat([features.embeds, maps.permute(1, 0, 2).reshape(maps.shape[1], -1)], dim=-1)


def _checked_embeds(features, deepstack_maps: int) -> Tensor:
    """`vllm_embeds`, refusing embeddings of another width: vLLM does not check a dict's embedding width, and the bad
    request fails inside its engine core, after which the in-process engine hung on the next request (measured)."""
    embeds = vllm_embeds(features)
    if embeds.shape[-1] != (1 + deepstack_maps) * features.embeds.shape[-1]:
        have = 0 if features.deepstack is None else features.deepstack.shape[0]
        raise ValueError(
            f"image embeddings of width {embeds.shape[-1]} (features with {have} DeepStack maps), "
            f"the model takes the merged embeddings and {deepstack_maps} maps: features of another "
            "model, or a vision-cache entry without its maps"
        )
    return embeds


def video_frames(clip: VideoClip, geometry) -> tuple[np.ndarray, dict]:
    """(frames [T, H, W, 3] uint8 at the model's size, metadata) as vLLM's Qwen processors take a sampled video: the
    metadata says the frames are already taken (`do_sample_frames: false`) at `frames_indices` of a stream at `fps`,
    from which Qwen3-VL writes its timestamps (index / fps) and Qwen2.5-VL derives its sampled rate
    (len(indices) / total_num_frames x fps = the rate the frames represent)."""
    info = clip.info()
    frames = np.stack([np.asarray(f.convert("RGB")) for f in clip.resized_frames(geometry)])
    total = max(len(info.indices), round(len(info.indices) * info.source_fps / info.sample_fps))
    metadata = {
        "fps": float(info.source_fps),
        "frames_indices": list(info.indices),
        "total_num_frames": int(total),
        "duration": total / info.source_fps,
        "width": int(frames.shape[2]),
        "height": int(frames.shape[1]),
        "video_backend": "pyav",
        "do_sample_frames": False,
    }
    return frames, metadata


def build_request(
    prompt: PromptInputs, fmt, features=None, mm_input: str = "embeds", deepstack_maps: int = 0, geometry=None
) -> dict:
    """One vLLM prompt: our token ids with unexpanded placeholders, plus every image and the video as embeddings or
    pixels (`multi_modal_uuids` per item in pixels mode: the content hashes, which spare vLLM hashing pixels).

    `fmt`: a PlaceholderFormat, or an image pad id for prompts of images only. `features`: the prompt's parts'
    ImageFeatures in `sources` order (an ImageFeatures alone for a one-image prompt). `deepstack_maps`: maps the model
    takes (Qwen3-VL; else 0). `geometry`: the processor's, for a video's frames in pixels mode."""
    if not isinstance(fmt, PlaceholderFormat):
        fmt = PlaceholderFormat(image_token_id=int(fmt), deepstack_maps=deepstack_maps)
    if mm_input not in MM_INPUTS:
        raise ValueError(f"rollout.vllm.mm_input must be one of {', '.join(MM_INPUTS)}, got {mm_input!r}")
    if prompt.video_grid_thw is not None and fmt.video_token_id is None:
        raise ValueError("a video prompt needs the model's PlaceholderFormat, not only its image pad id")
    ids = request_prompt_ids(prompt, fmt)
    n_images, has_video = mm_counts(prompt)["image"], prompt.video_grid_thw is not None
    if ids.count(fmt.image_token_id) != n_images:
        raise ValueError(f"the prompt has {n_images} images but {ids.count(fmt.image_token_id)} image pad runs")
    request: dict = {"prompt_token_ids": ids, "multi_modal_data": {}}
    images, clip = prompt.sources[:n_images], prompt.sources[-1] if has_video else None
    if mm_input == "embeds":
        if features is None:
            raise ValueError("mm_input='embeds' needs the prompt's cached features")
        parts = list(features) if isinstance(features, (list, tuple)) else [features]
        embeds = [_checked_embeds(f, fmt.deepstack_maps) for f in parts]
        if n_images:
            request["multi_modal_data"]["image"] = {
                "image_embeds": torch.cat(embeds[:n_images]),
                "image_grid_thw": torch.stack([f.grid_thw.reshape(3) for f in parts[:n_images]]),
            }
        if has_video:
            video = {"video_embeds": embeds[-1], "video_grid_thw": parts[-1].grid_thw.reshape(1, 3)}
            if fmt.seconds_per_patch:  # Qwen2.5-VL: without it vLLM spaces the temporal positions 1 s apart
                video["second_per_grid_ts"] = torch.tensor([fmt.temporal_patch_size / parts[-1].video_fps])
            if fmt.timestamps:  # Qwen3-VL: the `<t seconds>` text vLLM writes before each temporal patch
                video["timestamps"] = torch.tensor([video_timestamps(clip, fmt)])
            request["multi_modal_data"]["video"] = video
        return request
    if n_images:
        pil = [load_image(i) for i in images]
        request["multi_modal_data"]["image"] = pil[0] if n_images == 1 else pil
        request["multi_modal_uuids"] = {"image": [image_sha256(i) for i in images]}
    if has_video:
        _add_frames(request, clip, geometry)
    return request


def _add_frames(request: dict, clip: VideoClip, geometry) -> None:
    """The video as its frames at the model's size; vLLM's video processor must neither resize nor sample them."""
    if geometry is None:
        raise ValueError("a video sent as frames needs the processor's geometry")
    request["multi_modal_data"]["video"] = [video_frames(clip, geometry)]
    request.setdefault("multi_modal_uuids", {})["video"] = [clip.sha256(geometry)]
    request["mm_processor_kwargs"] = {"videos_kwargs": {"do_resize": False, "do_sample_frames": False}}
