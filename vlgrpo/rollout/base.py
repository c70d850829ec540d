"""The rollout-engine protocol: G completions for each of B prompts, weight updates, a policy version, counters.

Engines (hf, vllm) implement it; the trainer and the evals runner only see this. Knows nothing of rewards or losses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor

from vlgrpo.types import RolloutGroup, Sample


@dataclass
class Adapter:
    """A LoRA adapter in PEFT's saved form (adapter_config.json, adapter_model.safetensors): what an engine that
    applies adapters itself (vLLM) gets after each step instead of the merged weights."""

    config: dict
    tensors: dict[str, Tensor]

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def staleness(cfg) -> int:
    """rollout.max_staleness, its default resolved: 0 when colocated, 1 with placement=split."""
    r = cfg.rollout
    return r.max_staleness if r.max_staleness is not None else int(r.placement == "split")


@dataclass
class SamplingParams:
    """How completions are sampled. `temperature=0` is greedy decoding (the evals runner uses it)."""

    completions_per_prompt: int = 1
    """G: completions per prompt (the GRPO group size; config key `rollout.completions_per_prompt`)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    """Stop strings besides EOS; the text is cut before the stop string, the tokens keep the one that completed it."""
    seed: int | None = None
    """Seed of the sampling RNG for this call (None: the global torch RNG)."""

    def __post_init__(self):
        checks = [
            (self.completions_per_prompt >= 1, "completions_per_prompt", "must be >= 1"),
            (self.temperature >= 0, "temperature", "must be >= 0 (0 = greedy)"),
            (0 < self.top_p <= 1, "top_p", "must be in (0, 1]"),
            (self.top_k >= 0, "top_k", "must be >= 0 (0 disables it)"),
            (self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1"),
            (all(isinstance(s, str) and s for s in self.stop), "stop", "must be a list of non-empty strings"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name} {why}, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


PROMPT_KEYS = ("answer_format", "box_format", "system_prompt", "video_sampling", "thinking")
"""The prompt settings an engine passes to `policy.prompt.build_prompt` (its `prompt_kw`)."""


def cut_at_stop(text: str, stop: list[str]) -> str:
    """The completion text as every engine reports it: cut before the first stop string (the tokens keep it)."""
    found = [text.index(s) for s in stop if s in text]
    return text[: min(found)] if found else text


class RolloutEngine(Protocol):
    """What the trainer needs from a generation backend."""

    policy_version: int
    """Optimiser step of the weights the engine samples with (copied into every RolloutGroup)."""
    holds_own_weights: bool
    """True when the engine samples with its own copy of the weights (vLLM): the trainer then sends weights after
    each update and compares its log-probs with the engine's. False when it decodes on the trainer's module."""

    @classmethod
    def from_config(cls, cfg, lm, vision_cache, box_format: str) -> RolloutEngine:
        """The engine a run config asks for; `lm` is the trainer's LoadedModel (vlgrpo.registry.ENGINE names the
        class)."""
        ...

    @classmethod
    def for_eval(
        cls,
        lm,
        vision_cache,
        *,
        dtype: str,
        batch_prompts: int,
        engine_kwargs: dict,
        gpu_memory_utilization: float,
        answer_format: str,
        box_format: str,
        system_prompt: str,
    ) -> RolloutEngine:
        """The greedy decoder of `vlgrpo eval --model` on a loaded checkpoint."""
        ...

    def generate(self, samples: list[Sample], params: SamplingParams) -> list[RolloutGroup]:
        """One RolloutGroup per sample, in order, each with `params.completions_per_prompt` completions."""
        ...

    def update_weights(self, named_params: Iterable[tuple[str, Tensor]] | Adapter | None, version: int) -> None:
        """Make the engine sample with the trainer's current weights (HF names), tagged `version`; None: it shares
        the trainer's model (a version bump); an `Adapter`: only engines built for `adapter_sync` take one."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters since the last reset, namespaced `rollout/*`."""
        ...

    def reset_stats(self) -> None: ...


class EngineCounters:
    """The counters every engine keeps (`rollout/*` metrics since the last reset): an engine lists its own in
    `COUNTERS` and counts vision-cache work with `features`."""

    COUNTERS: tuple[str, ...] = (
        "prompts",
        "completions",
        "prefill_tokens",
        "generated_tokens",
        "encoder_calls",
        "images_encoded",
        "videos_encoded",
        "placeholder_sampled",
    )
    _counts: dict[str, int]

    def stats(self) -> dict[str, float]:
        return {f"rollout/{k}": v for k, v in self._counts.items()}

    def reset_stats(self) -> None:
        self._counts = {k: 0 for k in self.COUNTERS}

    def features(self, cache, prompts: list) -> list[list]:
        """Each prompt's features (`cache.get_rows` over its `sources`), counting the encoder calls, images and
        videos it took (0 when all were cached). A cached grid that differs from the prompt's is refused: the
        processor's pixel bounds changed without a new cache key."""
        before = cache.stats()
        feats = cache.get_rows([p.sources for p in prompts])
        after = cache.stats()
        for key in ("encoder_calls", "images_encoded", "videos_encoded"):
            self._counts[key] += after[key] - before[key]
        for p, row in zip(prompts, feats):
            want = p.image_grid_thw.tolist() + ([] if p.video_grid_thw is None else p.video_grid_thw.tolist())
            got = [f.grid_thw.tolist() for f in row]
            if got != want:
                raise ValueError(
                    f"cached features have grids {got} but the prompt expects {want}: the processor's "
                    "min/max pixels changed without a new cache key"
                )
        return feats
