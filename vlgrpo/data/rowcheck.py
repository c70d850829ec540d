"""Why a row cannot be trained on, decided in one place for the trainer (which skips such a row when it draws it) and
`vlgrpo data doctor` (which reports it): its images or video do not decode or resize, its text holds the chat
template's control tokens, its image_size or a box does not fit its image; and how many tokens its prompt takes
(`prompt_budget`: every image and the video counted with the processor's geometry, plus the text) and a multi-turn
trajectory after it (`trajectory_tokens`).

Works on a Sample and its inspected images and video (`images.inspect_image`, `video.inspect_video`); knows nothing
of models or tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlgrpo.data.images import ImageError, ImageInfo, ProcessorGeometry
from vlgrpo.data.prompts import MAX_TOOL_TEXT_TOKENS, VISION_PLACEHOLDERS, reserved_tokens
from vlgrpo.data.video import VideoInfo
from vlgrpo.types import Sample

Problem = tuple[str, str]
"""(check, message), e.g. ("image_missing", "image file 'x.png' does not exist")."""
OVERLONG = "prompt_too_long"
"""The check of a row whose prompt (visual tokens + text) is longer than data.max_prompt_length: skipped in training
and counted in `data/overlong_rows`, never truncated inside an image or a video."""
TEMPLATE_TOKENS = 13
"""Qwen2-VL / Qwen2.5-VL chat-template tokens around one user turn, its visual parts left out: <|im_start|>system\\n
... <|im_end|>\\n<|im_start|>user\\n ... <|im_end|>\\n<|im_start|>assistant\\n."""
VISION_WRAP = 2
"""<|vision_start|> and <|vision_end|> around each image's and each video's pad run."""
TIMESTAMP_TOKENS = 8
"""Qwen3-VL's label and wrap of one temporal patch, `<1.2 seconds><|vision_start|>...<|vision_end|>`: 6 tokens of
label in Qwen's tokenizer below 10 s (`<`, each digit, `.`, ` seconds`, `>`; 7 up to 100 s) and the pair."""
DEFAULT_SYSTEM_TOKENS = 6
"""'You are a helpful assistant.', which the template inserts when data.system_prompt is empty."""
TOOL_RESPONSE_TOKENS = 24
"""The markup of one tool-response turn around its crop (`data.prompts.TOOL_RESPONSE`) with Qwen's released
tokenizers, where each tag is one token: what the planner and the doctor count without a tokenizer at hand. A run
counts it with its own tokenizer (`data.prompts.tool_response_markup`)."""


def trajectory_tokens(max_new_tokens: int, max_turns: int, crop_tokens: int, markup: int = TOOL_RESPONSE_TOKENS) -> int:
    """The tokens after the prompt that a rollout may hold: one turn's max_new_tokens each turn, and between two turns
    a tool response: its `markup`, a crop of at most `crop_tokens` (a crop is no larger than the image it is cut from)
    and at most MAX_TOOL_TEXT_TOKENS of the tool's text or error."""
    return max_turns * max_new_tokens + (max_turns - 1) * (markup + crop_tokens + MAX_TOOL_TEXT_TOKENS)


@dataclass
class RowVisuals:
    """The inspected visual parts of one row: one ImageInfo per image (in `Sample.images` order), the video's."""

    images: list[ImageInfo] = field(default_factory=list)
    video: VideoInfo | None = None


def text_problems(s: Sample) -> list[Problem]:
    """Reserved tokens in the question (a forged turn, extra image slots) or in the gold answer (which no completion
    can then state: decoding stops at the end of the turn and never samples a vision token)."""
    out = []
    in_question = reserved_tokens(s.question)
    vision = [t for t in in_question if t in VISION_PLACEHOLDERS]
    other = [t for t in in_question if t not in VISION_PLACEHOLDERS]
    if vision:
        out.append(
            (
                "placeholder_literal",
                f"the question contains {', '.join(vision)}: vlgrpo inserts the image "
                "placeholders itself, and a literal one breaks the image-token count; remove it",
            )
        )
    if other:
        out.append(
            (
                "template_token",
                f"the question contains {', '.join(other)}: the tokenizer reads them as the "
                "chat template's control tokens, which would end the user turn inside the prompt (or forge "
                "another turn); remove them",
            )
        )
    in_answer = reserved_tokens(s.answer or "")
    if in_answer:
        out.append(
            (
                "template_token",
                f"the answer contains {', '.join(in_answer)}: a completion stops at the end of "
                "its turn and never samples a vision token, so no completion can state this answer; remove "
                "them",
            )
        )
    return out


def image_tokens(info: ImageInfo, geometry: ProcessorGeometry) -> int:
    """Image tokens of the decoded image, 0 when it cannot be used (unreadable, or refused by Qwen's resize)."""
    if info.problem is not None:
        return 0
    w, h = info.decoded
    try:
        return geometry.num_image_tokens(h, w)
    except ImageError:
        return 0


def video_tokens(info: VideoInfo | None, geometry: ProcessorGeometry) -> int:
    """<|video_pad|> tokens of the sampled video (frames / temporal patch x tokens per frame); 0 when unusable."""
    if info is None or info.problem is not None:
        return 0
    try:
        return info.num_tokens(geometry)
    except ImageError:
        return 0


def image_problems(s: Sample, info: ImageInfo, geometry: ProcessorGeometry, index: int | None = None) -> list[Problem]:
    """One image, then what the row says about it: image_size and its boxes against the real (decoded) size. `index`
    is its place in `images` on a row with several (messages name it; only its own boxes are checked)."""
    name = "" if index is None else f"image {index} of {len(s.images)}: "
    if info.problem is not None:
        return [(info.problem[0], name + info.problem[1])]
    (w, h), (hw, hh) = info.decoded, info.header
    try:
        tokens = geometry.num_image_tokens(h, w)
    except ImageError as e:  # Qwen's resize refuses it (an aspect ratio above 200)
        return [("image_geometry", name + str(e))]
    out = []
    pads = tokens if (hw, hh) == (w, h) else geometry.num_image_tokens(hh, hw)  # the prompt's count: the header's
    if pads != tokens:
        out.append(
            (
                "placeholder_count",
                f"{name}the prompt would get {pads} <|image_pad|> tokens (header size "
                f"{hw}x{hh}) but the decoded {w}x{h} image gives {tokens} features",
            )
        )
    if s.image_size is not None and tuple(s.image_size) != (w, h):
        out.append(
            (
                "image_size_mismatch",
                f"image_size {list(s.image_size)} but the image is {w}x{h} px; box "
                "rewards scale by image_size, so every box would move: correct it or leave it out",
            )
        )
    owners = s.box_images or [0] * len(s.boxes)
    for box, owner in zip(s.boxes, owners):
        x1, y1, x2, y2 = box
        if owner == (index or 0) and (x1 < 0 or y1 < 0 or x2 > w or y2 > h):
            out.append(
                (
                    "box_out_of_image",
                    f"{name}box {box} lies outside the {w}x{h} image (boxes are "
                    "original-image pixels, [x1, y1, x2, y2])",
                )
            )
    return out


def video_problems(info: VideoInfo, geometry: ProcessorGeometry) -> list[Problem]:
    """The video decodes (every frame of a list; a file to its end) and its frames resize for the model."""
    if info.problem is not None:
        return [info.problem]
    try:
        info.grid_thw(geometry)
    except ImageError as e:
        return [("video_geometry", str(e))]
    return []


def visual_parts(s: Sample) -> str:
    """'2 images', 'a video', '1 image and a video'."""
    images = f"{len(s.images)} image{'s' * (len(s.images) != 1)}" if s.images else ""
    return " and ".join(p for p in (images, "a video" if s.video is not None else "") if p)


def row_problems(s: Sample, info: ImageInfo | RowVisuals, geometry: ProcessorGeometry) -> list[Problem]:
    """Every reason the row cannot be trained on; empty when it can. `info` is every visual part's inspection
    (`RowVisuals`), or a one-image row's ImageInfo."""
    if isinstance(info, ImageInfo):
        info = RowVisuals([info])
    several = len(s.images) > 1
    out = []
    if s.answer_type == "box" and len(set(s.box_images)) > 1:
        out.append(
            (
                "boxes_across_images",
                f"the gold boxes lie in images {sorted(set(s.box_images))}: a box answer "
                "names no image, so every box of a box-answer row must lie in one image",
            )
        )
    for i, image in enumerate(info.images):
        out += image_problems(s, image, geometry, i if several else None)
    if info.video is not None:
        out += video_problems(info.video, geometry)
    return out + text_problems(s)


@dataclass(frozen=True)
class PromptBudget:
    """The tokens of one row's prompt, by part."""

    images: tuple[int, ...]
    """<|image_pad|> tokens of each image, in `Sample.images` order."""
    video: int
    """<|video_pad|> tokens of the video (0 without one)."""
    template: int
    """Chat-template tokens: the turn markers, the default system prompt when none is set, and the
    <|vision_start|> / <|vision_end|> pair around each visual part."""
    text: int
    """Question, instruction and system prompt: exact when the caller tokenised them, else its estimate."""

    @property
    def visual(self) -> int:
        return sum(self.images) + self.video

    @property
    def certain(self) -> int:
        """Everything but the text: what no rewording of the question can shorten."""
        return self.visual + self.template

    @property
    def total(self) -> int:
        return self.certain + self.text


def prompt_budget(
    s: Sample,
    visuals: RowVisuals,
    geometry: ProcessorGeometry,
    text_tokens: int,
    system_prompt: str = "",
    timestamps: bool = False,
) -> PromptBudget:
    """The prompt tokens of a row: each image by smart_resize at the run's geometry, the video's sampled frames after
    temporal merging (frames / temporal_patch_size x tokens per frame at the video pixel bounds), the chat template,
    and `text_tokens` (question + instruction + system prompt, counted by the caller). A part that cannot be used
    counts 0 (it is a row problem of its own). `timestamps` (Qwen3-VL): each temporal patch of the video has its own
    `<t seconds>` label and wrap, TIMESTAMP_TOKENS each, in place of the video's one wrap. `vlgrpo data doctor`
    counts with this; the trainer counts the tokenised prompt itself."""
    parts = len(s.images) + (s.video is not None)
    template = TEMPLATE_TOKENS + VISION_WRAP * parts + (0 if system_prompt else DEFAULT_SYSTEM_TOKENS)
    video = video_tokens(visuals.video, geometry)
    if timestamps and video:
        template += visuals.video.grid_thw(geometry)[0] * TIMESTAMP_TOKENS - VISION_WRAP
    images = tuple(image_tokens(info, geometry) for info in visuals.images)
    return PromptBudget(images, video, template, text_tokens)
