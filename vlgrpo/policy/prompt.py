"""Prompt token ids built from a sample and the sizes of its images and video alone (no pixel processing): the chat
template with each vision placeholder expanded to its token count, as Qwen's processor writes it; the mask of the
placeholder ids that sampling and the trainer set to -inf; left padding. Shared by the rollout engines and the trainer.

A prompt holds one image, several, or images and a video, in `visual_sources` order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from torch import Tensor

from vlgrpo.data.images import ProcessorGeometry, image_size
from vlgrpo.data.prompts import render_messages
from vlgrpo.data.video import VideoSampling, frame_timestamps, visual_sources
from vlgrpo.families import family_of
from vlgrpo.models import placeholder_token_ids
from vlgrpo.types import InputError, Sample

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"


@dataclass(frozen=True)
class PromptSettings:
    """How an engine writes its prompts and how far a trajectory may go: the one value every engine is built from
    (`rollout.build.build_engine`: the trainer's, the split worker's, the in-loop eval's, `vlgrpo eval`'s and the
    demo's), so a setting added here reaches each of them."""

    answer_format: str = "think_answer"
    box_format: str = "qwen2_5"
    system_prompt: str = ""
    thinking: str = "auto"
    """data.thinking: auto leaves the template's enable_thinking at its default, on / off set it."""
    video_sampling: VideoSampling = VideoSampling()
    tools: tuple[str, ...] = ()
    """Tools the model may call (rollout.tools); () : one turn."""
    max_turns: int = 1
    max_total_length: int | None = None
    """Tokens a multi-turn trajectory may reach (rollout.max_total_length resolved); None: the engine's context."""

    @classmethod
    def from_config(cls, cfg, box_format: str, processor=None) -> PromptSettings:
        """A run's settings (data.*, rollout.tools / max_turns / max_total_length), with the resolved box convention
        (`reward.box_format` auto resolved by the reward context). `processor`: the policy's, whose geometry and
        tokenizer size the turn budget (None: the checkpoint's geometry, Qwen's released tokenizers' markup)."""
        from vlgrpo.memory.from_config import total_length

        d, r = cfg.data, cfg.rollout
        tools = tuple(r.tools)
        geometry = None if processor is None else ProcessorGeometry.from_processor(processor)
        tokenizer = None if processor is None else processor.tokenizer
        return cls(
            d.answer_format,
            box_format,
            d.system_prompt,
            d.thinking,
            VideoSampling.from_config(d.video),
            tools,
            r.max_turns if tools else 1,
            total_length(cfg, geometry, tokenizer) if tools else None,
        )

    def prompt_kw(self) -> dict:
        """The keywords of `build_prompt` (everything but the tools, which the multi-turn rollout renders)."""
        return dict(
            answer_format=self.answer_format,
            box_format=self.box_format,
            system_prompt=self.system_prompt,
            video_sampling=self.video_sampling,
            thinking=self.thinking,
        )


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
    opened: str = ""
    """What the generation prompt already opened of the assistant's turn and left unclosed ("<think>\n" for Qwen3.5
    with thinking on, Qwen3-VL Thinking checkpoints): the completion continues inside it, so its text is read,
    rewarded and scored as `opened + completion`; "" otherwise."""
    opening: str = ""
    """All the generation prompt wrote of the assistant's turn, closed or not: `opened`, or Qwen3.5's empty
    "<think>\n\n</think>\n\n" with thinking off. A tool response ends with it, as the template opens every turn."""
    messages: list[dict] = field(default_factory=list)
    """The chat messages the template rendered into `input_ids` (`build_prompt`; a continuation's are []): the system
    turn with the tools block where the template ignores `tools=`, the user turn with the instruction, the visual
    parts where they go (an image part names no file). A saved trajectory starts with them."""

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
    thinking: str = "auto",
    tools: list[dict] | None = None,
) -> PromptInputs:
    """Chat-template the sample and expand its placeholders from the sizes alone (no pixel processing): each image's
    <|image_pad|> to its token count, the video's to its frames' (Qwen3-VL: one `<t seconds>` block per temporal
    patch, as Qwen's processor writes it). The same ids as `processor(text, images, videos)`; tests pin that.
    `thinking` (data.thinking): auto leaves the template's enable_thinking at its default, on / off set it.
    `tools`: function schemas the model may call (`rollout/tools.py`), rendered by the template (`tools_prompt`)."""
    if not sample.images and sample.video is None:
        raise InputError(f"sample '{sample.id}' has no image or video; every vlgrpo prompt carries at least one")
    geometry = geometry or ProcessorGeometry.from_processor(processor)
    sources = visual_sources(sample, video_sampling or VideoSampling())
    grids = [geometry.grid_thw(*reversed(image_size(img))) for img in sample.images]
    messages = render_messages(sample, answer_format, box_format, system_prompt)
    switch = {} if thinking == "auto" else {"enable_thinking": thinking == "on"}
    text, messages = tools_prompt(processor, messages, tools or [], **switch)
    wants = {IMAGE_PAD: len(grids), VIDEO_PAD: int(sample.video is not None)}
    for pad, n in wants.items():
        if text.count(pad) != n:
            hint = (
                ""
                if pad == IMAGE_PAD or n == 0
                else (": the checkpoint's chat template has no video part (Qwen's own templates do); give it one")
            )
            raise InputError(
                f"sample '{sample.id}': the chat template produced {text.count(pad)} {pad} tokens, expected {n}{hint}"
            )
    pieces = text.split(IMAGE_PAD)
    text = pieces[0] + "".join(
        IMAGE_PAD * (gh * gw // geometry.merge_size**2) + rest for (_, gh, gw), rest in zip(grids, pieces[1:])
    )
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
        opened=opened_in_prompt(text),
        opening=turn_opening(text),
        messages=messages,
    )


def tools_prompt(processor, messages: list[dict], tools: list[dict], **switch) -> tuple[str, list[dict]]:
    """The chat-templated prompt with the tools' schemas where the template puts them (`tools=`, as Qwen3-VL's
    template does), and the messages it rendered: `apply_chat_template(messages, tools=tools)` gives the text back.
    A template that ignores `tools` (Qwen2.5-VL's released one) gets the block Qwen2.5's text template writes, at the
    end of the system turn (DeepEyes writes its zoom tool's schema into the system prompt)."""

    switch = {k: v for k, v in switch.items() if template_reads(processor, k)}

    def render(msgs: list[dict], **extra) -> str:
        return processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **switch, **extra)

    text = render(messages)
    if not tools:
        return text, messages
    with_tools = render(messages, tools=tools) if template_reads(processor, "tools") else text
    if with_tools != text:
        return with_tools, messages
    block = HERMES_TOOLS.format("\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if messages and messages[0]["role"] == "system":
        messages = [{"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}, *messages[1:]]
    else:
        messages = [{"role": "system", "content": block}, *messages]
    return render(messages), messages


def template_reads(processor, name: str) -> bool:
    """Whether the processor's chat template reads the variable `name` (tools, enable_thinking). A keyword it does not
    read changes nothing, and transformers takes it for a processor keyword and logs a warning at every call."""
    template = getattr(processor, "chat_template", None)
    return not isinstance(template, str) or name in template


HERMES_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\n<tools>\n{}\n</tools>\n\nFor each function call, return a json "
    "object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
"""The tools block of Qwen2.5's chat template (hermes style), the schemas one JSON object a line."""

ASSISTANT_TURN = "<|im_start|>assistant\n"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def turn_opening(prompt_text: str) -> str:
    """What the generation prompt wrote of the assistant's turn after its `<|im_start|>assistant\n` ("" for Qwen2.5-VL
    and Qwen3-VL Instruct, "<think>\n" or "<think>\n\n</think>\n\n" for Qwen3.5); "" for a prompt that does not end
    inside an assistant turn."""
    start = prompt_text.rfind(ASSISTANT_TURN)
    turn = prompt_text[start + len(ASSISTANT_TURN) :] if start >= 0 else ""
    return "" if "<|im_end|>" in turn or "<|im_start|>" in turn else turn


def opened_in_prompt(prompt_text: str) -> str:
    """The part of the assistant's turn the generation prompt already wrote, when it leaves a <think> block open
    (Qwen3.5's "<think>\n"); "" when it opens none or closes the one it opens (thinking off: "<think>\n\n</think>")."""
    turn = turn_opening(prompt_text)
    think = turn.rfind(THINK_OPEN)
    return turn if think >= 0 and THINK_CLOSE not in turn[think:] else ""


def continue_turn(opened: str, target: str, where: str = "") -> str:
    """The part of a whole assistant turn `target` (a gold answer rendered as "<think>...</think><answer>...") that a
    model prompted with `opened` still writes; `target` itself when nothing was opened. A target without the opened
    block cannot follow such a prompt: InputError (`where` names the row)."""
    if not opened:
        return target
    tag = opened.strip()
    if not target.lstrip().startswith(tag):
        raise InputError(
            f"{where}the prompt opens {tag!r} (data.thinking, or a Thinking checkpoint's template) but the target "
            f"{target[:40]!r} does not start inside it: use data.answer_format=think_answer, or data.thinking=off"
        )
    rest, space = target.lstrip()[len(tag) :], opened[len(opened.rstrip()) :]  # space: the "\n" after the tag
    return rest[len(space) :] if rest.startswith(space) else rest


def writes_timestamps(processor) -> bool:
    """Qwen3-VL's (and Qwen3.5's) processor writes each video frame's time as text (`<1.2 seconds>`); Qwen2/2.5-VL's
    do not."""
    return family_of(processor).video_timestamps


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
