"""RewardContext: the few settings reward functions need, frozen, built once from the config.

Reward functions never see the Config object; they get this record (box convention, answer format, tolerances,
IoU threshold, the accuracy gate, what the format reward requires, the processor geometry for resized-pixel
boxes and the judge model's client). Knows nothing of models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vlgrpo.rewards.boxes import ARCH_BOX_FORMAT, BOX_FORMATS, box_format_for_arch
from vlgrpo.rewards.extract import FALLBACKS
from vlgrpo.rewards.format import ANSWER_FORMATS

if TYPE_CHECKING:
    from vlgrpo.data.images import ProcessorGeometry
    from vlgrpo.rewards.judge import Judge


@dataclass(frozen=True)
class RewardContext:
    box_format: str = "plain"
    """How the model writes boxes: qwen2, qwen2_5, qwen3 or plain (already resolved, never "auto")."""
    answer_format: str = "think_answer"
    """Format the model was asked for: think_answer or answer (selects the format-reward variant)."""
    number_atol: float = 0.0
    """Absolute tolerance of numeric answers."""
    number_rtol: float = 0.0
    """Relative tolerance of numeric answers (relative to the gold value)."""
    iou_threshold: float = 0.5
    """tau of the thresholded IoU (and of `accuracy` on box samples)."""
    gate_accuracy_on_format: bool = False
    """Correctness rewards (accuracy, iou*, giou) count only when the format holds (the tags, not the content)."""
    format_requires_answer: bool = True
    """The format reward also needs an answer that parses for the sample's answer type (a number, an option letter,
    yes/no, a math expression, a box, non-empty text), so `<answer>banana</answer>` earns no format reward."""
    answer_fallback: tuple[str, ...] = FALLBACKS
    """Extractors tried when a completion has no answer block and no \\boxed{} (empty tuple: none)."""
    geometry: ProcessorGeometry | None = None
    """Processor resize geometry for qwen2_5 boxes (None: `vlgrpo.data.images.DEFAULT_GEOMETRY`, the released
    Qwen2.5-VL processors' settings)."""
    judge: Judge | None = None
    """The judge model's client (reward.judge), shared by every step of a run; None: no judge configured."""

    def __post_init__(self) -> None:
        checks = [
            (self.box_format in BOX_FORMATS, "box_format", self.box_format, ", ".join(BOX_FORMATS)),
            (self.answer_format in ANSWER_FORMATS, "answer_format", self.answer_format, ", ".join(ANSWER_FORMATS)),
            (
                all(f in FALLBACKS for f in self.answer_fallback),
                "answer_fallback",
                self.answer_fallback,
                "a tuple of " + ", ".join(FALLBACKS),
            ),
            (
                self.number_atol >= 0 and self.number_rtol >= 0,
                "number_atol/number_rtol",
                (self.number_atol, self.number_rtol),
                "values >= 0",
            ),
            (0 <= self.iou_threshold <= 1, "iou_threshold", self.iou_threshold, "a value in [0, 1]"),
        ]
        for ok, key, value, accepted in checks:
            if not ok:
                raise ValueError(f"RewardContext.{key} = {value!r} is not accepted; use {accepted}")


def context_from_config(cfg: Any, arch: str | None = None, geometry: ProcessorGeometry | None = None) -> RewardContext:
    """Build the context from a Config (reads `reward.*`, `data.answer_format`, `model.*`).

    reward.box_format = "auto" resolves from `arch` (the loaded model's family, e.g. "qwen2_5_vl"), else from
    model.arch. Without `geometry`, the one a run would use is read without loading the model: the checkpoint
    directory's processor config when local, else the released processors' defaults, then model.min_pixels /
    max_pixels (`vlgrpo.data.images.checkpoint_geometry`).
    """
    from vlgrpo.config import ConfigError

    r = cfg.reward
    box_format = r.box_format
    if box_format == "auto":
        arch = arch if arch not in (None, "auto") else cfg.model.arch
        if arch == "auto":
            raise ConfigError(
                "reward.box_format is 'auto' but the model arch is unknown: pass the loaded model's arch, set "
                f"model.arch ({', '.join(ARCH_BOX_FORMAT)}) or set reward.box_format to one of {', '.join(BOX_FORMATS)}"
            )
        try:
            box_format = box_format_for_arch(arch)
        except ValueError as e:
            raise ConfigError(f"reward.box_format=auto: {e}") from None
    judge = None
    if r.judge.base_url:
        from vlgrpo.rewards.judge import Judge

        judge = Judge(r.judge)
    if geometry is None and box_format == "qwen2_5":
        from vlgrpo.data.images import checkpoint_geometry

        geometry, _ = checkpoint_geometry(cfg.model.name_or_path, cfg.model.min_pixels, cfg.model.max_pixels)
    try:
        return RewardContext(
            box_format=box_format,
            answer_format=cfg.data.answer_format,
            number_atol=r.number_atol,
            number_rtol=r.number_rtol,
            iou_threshold=r.iou_threshold,
            gate_accuracy_on_format=r.gate_accuracy_on_format,
            format_requires_answer=r.format_requires_answer,
            geometry=geometry,
            judge=judge,
        )
    except ValueError as e:
        raise ConfigError(f"reward section: {e}") from None
