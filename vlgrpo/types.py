"""Plain data records passed between layers: a dataset Sample, a RolloutGroup from an engine.

Knows nothing about models, files or configs; every other module may import it.
Shape alphabet: B prompts, G completions per prompt, T tokens, N image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ANSWER_TYPES = ("number", "choice", "yesno", "text", "box", "math")


class InputError(ValueError):
    """Base of every error caused by user input (config, data, images, checkpoints): the CLI prints these
    as one clear line instead of a traceback. Messages name the file/row/key and what is accepted."""

    transient: bool = False
    """Whether a restart can help (a service that is down, a directory that vanished): torchrun's restarts retry it.
    False (bad config or data, the non-finite limit, a full disk, a damaged checkpoint): a restart would only repeat
    it, so the launch records it and its restarts stop at once (`trainer.rundir.refuse_replay`)."""


@dataclass
class Video:
    """A row's video: a video file (`path`) or its frames as image files, in order (`frames`). `fps` and `max_frames`
    override data.video for this row; `fps` is the frame rate the model sees: a file is sampled at it, a frame list
    was taken at it."""

    path: str | None = None
    frames: list[str | bytes] = field(default_factory=list)
    fps: float | None = None
    max_frames: int | None = None

    def to_json(self) -> str | list | dict:
        """The row form `data.schema` reads back: the path or the frame list, a mapping when it overrides data.video
        (frames held as bytes are not serialisable and become None)."""
        source = self.path if self.path is not None else [f if isinstance(f, str) else None for f in self.frames]
        overrides = {k: v for k, v in (("fps", self.fps), ("max_frames", self.max_frames)) if v is not None}
        return {("path" if self.path is not None else "frames"): source, **overrides} if overrides else source


@dataclass
class Sample:
    """One task about an image, several images or a video. Boxes are always stored in *original-image* pixels, xyxy.

    The model-specific box convention (0-1000, resized pixels, ...) is applied only at the model
    boundary (rewards, evals), never in the dataset. A one-image row has `image` set and `images == [image]`; a row
    with several images or a video has `image` None, so code that reads `image` alone never takes the first of several.
    """

    id: str
    question: str
    answer: str | None = None
    answer_type: str = "text"
    image: str | bytes | None = None
    """The row's image when its visual input is exactly one image: a path (absolute, or resolved by the adapter) or the
    raw encoded bytes. None on a row with several images or a video (see `images`, `video`)."""
    images: list[str | bytes] = field(default_factory=list)
    """Every image of the row, in prompt order; [image] for a one-image row (filled in from `image`)."""
    video: Video | None = None
    """The row's video, when it has one (at most one per row)."""
    boxes: list[list[float]] = field(default_factory=list)
    """Gold boxes in original-image pixels, [[x1, y1, x2, y2], ...]."""
    box_images: list[int] = field(default_factory=list)
    """On a row with several images: the index in `images` of the image each box lies in (parallel to `boxes`); empty
    on a one-image row."""
    objects: list[str] = field(default_factory=list)
    """Names of the objects present in the image (for POPE-style probes)."""
    image_size: tuple[int, int] | None = None
    """(width, height) of the original image, when known without opening it."""
    task: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    row: int | None = field(default=None, compare=False, repr=False)
    """1-based row of the dataset file it was read from (its line in a JSONL file), for messages; None when built in
    code. Not part of `to_dict`: it names where the sample is, not what it is."""

    def __post_init__(self) -> None:
        if self.image is not None:
            if self.images and list(self.images) != [self.image]:
                raise ValueError(f"sample '{self.id}': `image` is the one-image form of `images`; give one of them")
            self.images = [self.image]
        self.images = list(self.images)
        self.image = self.images[0] if len(self.images) == 1 and self.video is None else None

    @property
    def several_images_or_video(self) -> bool:
        """Two or more images, or a video (POPE, which asks about one image, leaves such rows out)."""
        return len(self.images) > 1 or self.video is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict in the row schema (bytes images are not serialisable and are dropped to None). A one-image
        row is written as it always was; `images`, `video` and per-image boxes appear only where the row has them."""
        row: dict[str, Any] = {
            "id": self.id,
            "image": self.image if isinstance(self.image, str) else None,
            "question": self.question,
            "answer": self.answer,
            "answer_type": self.answer_type,
            "boxes": [list(b) for b in self.boxes],
            "objects": list(self.objects),
            "image_size": list(self.image_size) if self.image_size else None,
            "task": self.task,
            "meta": dict(self.meta),
        }
        if self.image is None and self.images:
            row["images"] = [im if isinstance(im, str) else None for im in self.images]
        if self.video is not None:
            row["video"] = self.video.to_json()
        if self.box_images:
            row["boxes"] = [{"image": i, "box": list(b)} for i, b in zip(self.box_images, self.boxes)]
        return row


@dataclass
class Completion:
    """One sampled completion of a prompt."""

    token_ids: list[int]
    text: str
    finish_reason: str
    """"stop" (EOS or stop string), "length" (max new tokens reached)."""
    logprobs: list[float] | None = None
    """Sampling log-probs of each token under the engine, when the engine reports them."""
    tool_mask: list[int] | None = None
    """Multi-turn rollouts with tools (`rollout/turns.py`): 1 on each token a tool-response turn inserted (the model
    did not sample it: no loss, no ratio), 0 on the model's own; None: every token is the model's."""
    images: list[bytes] = field(default_factory=list)
    """PNG bytes of each image a tool returned, in the order of their <|image_pad|> runs in `token_ids`."""
    turns: list[dict] = field(default_factory=list)
    """A multi-turn completion's turns as chat messages (role, content parts; an image part's `image` is the index of
    its entry in `images`), as its processor's chat template renders them back to `token_ids`: an assistant turn is
    what the model sampled (after what the prompt opened of it), a tool response the template's tool-response turn
    (`rollout.turns.tool_response_role`); empty for a one-turn completion."""
    prompt_messages: list[dict] = field(default_factory=list)
    """A multi-turn completion's prompt as the chat messages its template rendered (`PromptInputs.messages`): the
    conversation `turns` continue; empty for a one-turn completion."""
    routing: Any = None
    """A mixture-of-experts model's rollout routing: the experts each fed token went to, a [tokens fed (all but the
    last), MoE layers, k] integer tensor (`vlgrpo.policy.routing`); None when the engine recorded none."""

    @property
    def sampled_tokens(self) -> int:
        """Tokens the model sampled: all of them but a tool-response turn's (what a length budget or penalty counts)."""
        return len(self.token_ids) - (sum(self.tool_mask) if self.tool_mask else 0)


@dataclass
class RolloutGroup:
    """The G completions of one prompt, with the ids the trainer needs to re-score them."""

    sample: Sample
    prompt_ids: list[int]
    completions: list[Completion]
    policy_version: int = 0
    """Optimiser step of the weights that produced the completions."""
    prompt_routing: Any = None
    """A mixture-of-experts model's rollout routing of the prompt's tokens, [prompt tokens, MoE layers, k]; None when
    the engine recorded none."""
