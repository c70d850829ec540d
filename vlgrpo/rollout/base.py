"""The rollout-engine protocol: G completions for each of B prompts, weight updates, a policy version, counters.

Engines (hf, vllm) implement it; the trainer, the evals runner and the multi-turn rollout (`turns.ToolRollout`) only
see this. Knows nothing of rewards or losses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from vlgrpo.types import RolloutGroup, Sample

if TYPE_CHECKING:
    from vlgrpo.data.images import ProcessorGeometry
    from vlgrpo.policy.prompt import PromptInputs


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

    def generate(
        self, samples: list[Sample], params: SamplingParams, prompts: list[PromptInputs] | None = None
    ) -> list[RolloutGroup]:
        """One RolloutGroup per sample, in order, each with `params.completions_per_prompt` completions. `prompts`:
        the samples' prompts as the caller built them from the engine's own settings (the trainer's rows: one build
        per sample, `PromptSettings`); None: built here."""
        ...

    def update_weights(self, named_params: Iterable[tuple[str, Tensor]] | Adapter | None, version: int) -> None:
        """Make the engine sample with the trainer's current weights (HF names), tagged `version`; None: it shares
        the trainer's model (a version bump); an `Adapter`: only engines built for `adapter_sync` take one."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters since the last reset, namespaced `rollout/*`."""
        ...

    def reset_stats(self) -> None: ...

    # ------------------------------------------------------------ what a multi-turn rollout (ToolRollout) needs
    # Every engine has each member; one that lacks an ability says so by its value ("not supported"), never by lacking
    # the member.

    processor: Any
    """The policy's processor: its tokenizer writes the tool-response turns and reads the model's."""
    geometry: ProcessorGeometry
    """The processor's smart_resize settings: the images' (and a tool's crops') token counts."""
    prompt_kw: dict[str, Any]
    """The prompt settings `policy.prompt.build_prompt` gets (`PromptSettings.prompt_kw()`)."""
    max_model_len: int | None
    """Tokens a sequence may reach in the engine (vLLM's context); None: no bound of the engine's own."""
    max_images: int | None
    """Images one prompt may hold (vLLM's limit_mm_per_prompt): a tool's crops count; None: no bound."""
    keeps_turns: bool
    """Whether the engine keeps each completion's KV (`generate_prompts(keep_kv=True)`, `last_kv`) and continues it
    (`continue_prompts`), so a turn prefills only what came after it. False: each turn's prompt goes whole to
    `generate_prompts` (an engine may still find the earlier turns in a prefix cache)."""
    last_kv: list
    """Each completion's kept KV from the last `generate_prompts(keep_kv=True)` or `continue_prompts`, in the
    groups' order; always [] where `keeps_turns` is False."""

    def generate_prompts(
        self, samples: list[Sample], prompts: list[PromptInputs], params: SamplingParams, keep_kv: bool = False
    ) -> list[RolloutGroup]:
        """`generate` from prompts built already (`build_prompt`, or a trajectory's ids continued with its tool
        response): the next turn is never re-tokenised. `keep_kv` (only where `keeps_turns`): `last_kv` gets each
        completion's KV."""
        ...

    def continue_prompts(
        self, samples: list[Sample], prompts: list[PromptInputs], kvs: list, params: SamplingParams
    ) -> list[RolloutGroup]:
        """One completion per prompt, each the continuation of the completion whose kept KV is `kvs[i]`: only the
        tokens after it are prefilled; `last_kv` then holds the new KVs. NotImplementedError where not `keeps_turns`."""
        ...


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
