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


@dataclass
class Sample:
    """One image task. Boxes are always stored in *original-image* pixels, xyxy.

    The model-specific box convention (0-1000, resized pixels, ...) is applied only at the model
    boundary (rewards, evals), never in the dataset.
    """

    id: str
    question: str
    answer: str | None = None
    answer_type: str = "text"
    image: str | bytes | None = None
    """Path to the image file (absolute, or resolved by the adapter) or the raw encoded bytes."""
    boxes: list[list[float]] = field(default_factory=list)
    """Gold boxes in original-image pixels, [[x1, y1, x2, y2], ...]."""
    objects: list[str] = field(default_factory=list)
    """Names of the objects present in the image (for POPE-style probes)."""
    image_size: tuple[int, int] | None = None
    """(width, height) of the original image, when known without opening it."""
    task: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    row: int | None = field(default=None, compare=False, repr=False)
    """1-based row of the dataset file it was read from (its line in a JSONL file), for messages; None when built in
    code. Not part of `to_dict`: it names where the sample is, not what it is."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (bytes images are not serialisable and are dropped to None)."""
        return {
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


@dataclass
class Completion:
    """One sampled completion of a prompt."""

    token_ids: list[int]
    text: str
    finish_reason: str
    """"stop" (EOS or stop string), "length" (max new tokens reached)."""
    logprobs: list[float] | None = None
    """Sampling log-probs of each token under the engine, when the engine reports them."""


@dataclass
class RolloutGroup:
    """The G completions of one prompt, with the ids the trainer needs to re-score them."""

    sample: Sample
    prompt_ids: list[int]
    completions: list[Completion]
    policy_version: int = 0
    """Optimiser step of the weights that produced the completions."""
