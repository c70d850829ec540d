"""vLLM rollout backend, and the only module that imports vllm (lazily, inside `VLLMEngine.launch`).

Prompts carry our token ids with ONE placeholder per image and per video (vLLM expands them itself) and every image
and the video as our cached embeddings + grids (Qwen3-VL's DeepStack maps concatenated after the embeddings) or as
pixels (`inputs.py` builds the requests), at most `rollout.vllm.limit_mm_per_prompt` of each per prompt.
vLLM samples a group per request (its `n` = G) with its own seed, prefix caching shares the prompt. Weight
sync goes through vLLM's supported in-place reload (`reload_weights` on every worker), then resets the prefix cache and
the engine-side encoder cache. The engine reports the sampled tokens' log-probs after temperature and top-k / top-p
(`processed_logprobs`; `vllm_sampling.py` sets the request's sampling and reads its output); the trainer compares
them with its own and corrects the loss (`grpo.rollout_is`). Knows nothing of rewards or losses.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from torch import Tensor

from vlgrpo.config.validate import check_mm_limits
from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.policy.prompt import PromptInputs, PromptSettings, build_prompt, forbidden_mask
from vlgrpo.rollout.adapters import AdapterVersions
from vlgrpo.rollout.base import Adapter, EngineCounters, SamplingParams
from vlgrpo.rollout.turns import with_tool_images
from vlgrpo.rollout.vllm.inputs import (  # noqa: F401 - build_request, engine_prompt_ids: the request API, re-exported
    MM_INPUTS,
    ONE_IMAGE,
    PlaceholderFormat,
    build_request,
    check_prompt_limits,
    engine_prompt_ids,
)
from vlgrpo.rollout.vllm.sampling import request_seeds, sampling_kwargs, to_completions
from vlgrpo.rollout.vllm.settings import launch_args
from vlgrpo.rollout.vllm.weights import _refresh_tied_lm_head, checkpoint_weights
from vlgrpo.types import RolloutGroup, Sample

SLEEP_TAGS = ("weights", "kv_cache")  # vLLM's sleep-mode allocations, in the order they must wake


# ---------------------------------------------------------------- the engine


def refuse_hybrid_on_cpu(model_path: str) -> None:
    """vLLM's CPU build runs a hybrid model's Gated DeltaNet layers (Qwen3.5) wrong: NaN logits on every CPU kind this
    project has run it on (AVX2, AVX-512 with bf16, AMX), and in one CI run of 2026-12-07 finite logits for other
    tokens than the HF engine's, which no check on the output can tell from right ones. Refused before launch."""
    if torch.cuda.is_available():
        return
    from vlgrpo.families import family
    from vlgrpo.models import detect_arch

    try:
        arch = detect_arch(model_path)
    except Exception:  # noqa: BLE001 - an unknown checkpoint: vLLM's own errors name it
        return
    if family(arch).hybrid_attention:
        raise RuntimeError(
            f"{model_path} ({arch}) has Gated DeltaNet layers, which vLLM's CPU build computes wrong (NaN or other "
            "tokens' logits, vLLM 0.32, every CPU kind seen): use rollout.engine=hf on the CPU, or vLLM on a GPU"
        )


class VLLMEngine(EngineCounters):
    """RolloutEngine on a vLLM `LLM` (in-process engine core, as in TRL's colocate mode)."""

    holds_own_weights = True
    keeps_turns = False
    """vLLM keeps no completion's KV for us: a multi-turn rollout's next turn goes whole to `generate_prompts`, and
    prefix caching finds the earlier turns' blocks."""
    COUNTERS = (
        *EngineCounters.COUNTERS,
        "weight_syncs",
        "params_pushed",
        "adapter_syncs",
        "prefix_cache_hit_tokens",
        "prefix_cache_query_tokens",
    )

    def __init__(
        self,
        llm,
        processor,
        vision_cache=None,
        prompt: PromptSettings | None = None,
        mm_input: str = "embeds",
        push_visual: bool = True,
        sleep_level: int = 0,
        tied_embeddings: bool = False,
        deepstack_maps: int = 0,
        limit_mm_per_prompt: dict | None = None,
        max_loras: int = 0,
        release_mm_caches: bool = False,
    ):
        """`prompt`: how prompts are written (None: the defaults); the rest as `launch` and `from_config` set it."""
        if mm_input not in MM_INPUTS:
            raise ValueError(f"rollout.vllm.mm_input must be one of {', '.join(MM_INPUTS)}, got {mm_input!r}")
        if mm_input == "embeds" and vision_cache is None:
            raise ValueError("rollout.vllm.mm_input=embeds needs a VisionCache")
        self.llm, self.processor, self.cache, self.mm_input = llm, processor, vision_cache, mm_input
        self.prompt_kw = (prompt or PromptSettings()).prompt_kw()
        self.geometry = ProcessorGeometry.from_processor(processor)
        self.format = PlaceholderFormat.from_processor(processor, self.geometry.temporal_patch_size, deepstack_maps)
        """The model's vision tokens and the prompt form vLLM expands (`inputs.PlaceholderFormat`)."""
        self.image_token_id = self.format.image_token_id
        self.limits = check_mm_limits(ONE_IMAGE if limit_mm_per_prompt is None else limit_mm_per_prompt)
        """Images and videos a prompt may hold (vLLM's `limit_mm_per_prompt`); a prompt with more is refused."""
        self.forbidden_ids = sorted(
            set(torch.nonzero(forbidden_mask(processor.tokenizer, len(processor.tokenizer))).flatten().tolist())
        )
        self.push_visual, self.sleep_level, self.tied_embeddings = push_visual, sleep_level, tied_embeddings
        self.deepstack_maps = deepstack_maps
        """DeepStack maps each image's embeddings carry (Qwen3-VL: len(deepstack_visual_indexes); else 0)."""
        self.policy_version = 0
        self.release_mm_caches = release_mm_caches
        """Colocated runs: the multimodal caches are emptied after each rollout (EasyR1 clears the encoder cache
        for the same reason: the trainer's update needs that memory)."""
        self.max_loras = max_loras
        """Adapters vLLM holds at once (0: the engine was built without LoRA): rollout.max_staleness + 1, so groups
        in flight finish on their own policy."""
        self.lora_request = None
        """The policy's adapter as vLLM's LoRARequest, named by version (None: the base model is the policy)."""
        self._adapters = AdapterVersions(keep=max_loras + 1)  # vLLM has loaded the ones still in use
        self.max_model_len: int | None = None
        """The context vLLM was launched with (`launch` sets it): a multi-turn trajectory stays within it."""
        self.last_kv: list = []
        """Always empty (`keeps_turns` is False)."""
        self.asleep: set[str] = set()
        """Sleep-mode allocations currently released (subset of SLEEP_TAGS)."""
        self.reset_stats()

    @classmethod
    def launch(
        cls,
        model_path: str,
        processor,
        vision_cache=None,
        *,
        mm_input: str = "embeds",
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        max_model_len: int = 4096,
        enable_sleep_mode: bool = False,
        seed: int = 0,
        llm_kwargs: dict | None = None,
        limit_mm_per_prompt: dict | None = None,
        **engine_kw,
    ):
        """Build the `LLM` (prefix caching on, image and video embeddings accepted, at most `limit_mm_per_prompt`
        images and videos per prompt (None: one image, no video), stats on for the prefix-cache counters) and wrap
        it. The engine core runs in this process so weight reloads reach it.

        mm_input=pixels: vLLM runs its own image processor with the trainer's min/max pixels, so both see the same
        resized image and the same number of image tokens; a video's frames arrive at the model's size."""
        refuse_hybrid_on_cpu(model_path)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM  # the project's only vllm import

        geometry = ProcessorGeometry.from_processor(processor)
        kwargs = dict(llm_kwargs or {})
        limits = check_mm_limits(kwargs.pop("limit_mm_per_prompt", None) or limit_mm_per_prompt or ONE_IMAGE)
        if mm_input == "pixels":
            kwargs.setdefault(
                "mm_processor_kwargs", {"min_pixels": geometry.min_pixels, "max_pixels": geometry.max_pixels}
            )
        args = dict(
            model=model_path,
            enable_prefix_caching=True,
            enable_mm_embeds=(mm_input == "embeds"),
            limit_mm_per_prompt=limits,
            logprobs_mode="processed_logprobs",
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            enable_sleep_mode=enable_sleep_mode,
            seed=seed,
            disable_log_stats=False,
        )
        args = {**args, **kwargs}
        llm = LLM(**args)
        config = llm.llm_engine.model_config  # Qwen2.5-VL keeps the flag on the top-level config
        tied = any(getattr(c, "tie_word_embeddings", False) for c in (config.hf_config, config.hf_text_config))
        vision = getattr(config.hf_config, "vision_config", None)
        maps = len(getattr(vision, "deepstack_visual_indexes", None) or ())  # Qwen3-VL's DeepStack
        engine = cls(
            llm,
            processor,
            vision_cache,
            mm_input=mm_input,
            tied_embeddings=tied,
            deepstack_maps=maps,
            limit_mm_per_prompt=limits,
            **engine_kw,
        )
        engine.max_model_len = int(args["max_model_len"])
        return engine

    @classmethod
    def from_config(cls, cfg, lm, vision_cache, prompt: PromptSettings) -> VLLMEngine:
        """The engine a run config asks for (`rollout.vllm.*`; `rollout.build.build_engine`); `lm` is the trainer's
        LoadedModel."""
        return cls.launch(cfg.model.name_or_path, lm.processor, vision_cache, **launch_args(cfg, lm, prompt))

    @classmethod
    def for_eval(
        cls,
        lm,
        vision_cache,
        prompt: PromptSettings,
        *,
        model=None,
        dtype: str = "float32",
        engine_kwargs: dict | None = None,
        gpu_memory_utilization: float = 0.8,
        batch_prompts: int = 8,
    ) -> VLLMEngine:
        """The greedy decoder of `vlgrpo eval --model --engine vllm` (`rollout.build.build_engine`): vLLM on the
        checkpoint with our cached image and video features (`engine_kwargs` go to `vllm.LLM`; `limit_mm_per_prompt`
        there overrides the config's default, raised by a crop per turn with `prompt.max_turns` > 1); context up to
        4096 tokens or the model's maximum. `model` and `batch_prompts` concern the HF engine: vLLM loads its own
        copy and schedules every prompt it is given."""
        from vlgrpo.config.schema import VLLMConfig

        text = lm.model.config.get_text_config()
        max_len = min(4096, int(getattr(text, "max_position_embeddings", 4096)))
        return cls.launch(
            lm.path,
            lm.processor,
            vision_cache,
            max_model_len=max_len,
            gpu_memory_utilization=gpu_memory_utilization,
            limit_mm_per_prompt=with_tool_images(VLLMConfig().limit_mm_per_prompt, prompt.max_turns),
            llm_kwargs={"dtype": dtype, **(engine_kwargs or {})},
            prompt=prompt,
        )

    def generate(
        self, samples: list[Sample], params: SamplingParams, prompts: list[PromptInputs] | None = None
    ) -> list[RolloutGroup]:
        if prompts is None:
            prompts = [build_prompt(s, self.processor, self.geometry, **self.prompt_kw) for s in samples]
        return self.generate_prompts(samples, prompts, params)

    @property
    def max_images(self) -> int:
        """Images one prompt may hold: `limits["image"]`, a tool's crops included."""
        return self.limits["image"]

    def generate_prompts(
        self, samples: list[Sample], prompts: list[PromptInputs], params: SamplingParams, keep_kv: bool = False
    ) -> list[RolloutGroup]:
        """`generate` from prompts built already: a multi-turn rollout's next turn continues a trajectory from its
        token ids (never re-tokenised), its crops as images after the prompt's; prefix caching finds the earlier
        turns' KV blocks (`prefix_cache_hit_tokens`). `keep_kv` is refused: this engine keeps no KV."""
        if keep_kv:
            raise ValueError("the vLLM engine keeps no completion's KV (keeps_turns is False): call with keep_kv=False")
        from vllm import SamplingParams as VLLMSamplingParams

        for s, p in zip(samples, prompts):
            check_prompt_limits(s.id, p, self.limits)
        feats = self.features(self.cache, prompts) if self.mm_input == "embeds" else [None] * len(prompts)
        requests = [
            build_request(p, self.format, f, self.mm_input, geometry=self.geometry) for p, f in zip(prompts, feats)
        ]
        per_request = [
            VLLMSamplingParams(**sampling_kwargs(params, self.forbidden_ids, seed))
            for seed in request_seeds(params.seed, len(requests))
        ]
        self.wake_up()
        before = self._prefix_cache_counts()
        lora = {"lora_request": self.lora_request} if self.lora_request is not None else {}  # the policy's adapter
        outputs = self.llm.generate(requests, per_request, use_tqdm=False, **lora)
        after = self._prefix_cache_counts()
        self._counts["prefix_cache_hit_tokens"] += after[0] - before[0]
        self._counts["prefix_cache_query_tokens"] += after[1] - before[1]
        if self.release_mm_caches:  # colocated: nothing of this rollout's images outlives it on the trainer's GPU
            self.llm.reset_mm_cache()
            self.llm.llm_engine.reset_encoder_cache()
        if self.sleep_level:
            self.sleep(self.sleep_level)
        groups = []
        for s, p, out in zip(samples, prompts, outputs):
            engine_ids = getattr(out, "prompt_token_ids", None)
            if engine_ids is not None and len(engine_ids) != len(p.input_ids):
                raise RuntimeError(
                    f"vLLM expanded sample '{s.id}' to {len(engine_ids)} prompt tokens, the trainer has "
                    f"{len(p.input_ids)}: its image or video token count differs (check min/max pixels)"
                )
            completions, bad = to_completions(out, params, set(self.forbidden_ids), self._decode, p.opened)
            self._counts["placeholder_sampled"] += bad
            self._counts["prefill_tokens"] += len(p.input_ids)
            self._counts["generated_tokens"] += sum(len(c.token_ids) for c in completions)
            groups.append(RolloutGroup(s, list(p.input_ids), completions, self.policy_version))
        self._counts["prompts"] += len(samples)
        self._counts["completions"] += len(samples) * params.completions_per_prompt
        return groups

    def continue_prompts(self, samples, prompts, kvs, params) -> list[RolloutGroup]:
        """Not supported (`keeps_turns` is False): give each turn's whole prompt to `generate_prompts`."""
        raise NotImplementedError("the vLLM engine continues no kept KV: give each turn's prompt to generate_prompts")

    def _decode(self, ids: list[int]) -> str:
        return self.processor.tokenizer.decode(ids, skip_special_tokens=True)

    def _prefix_cache_counts(self) -> tuple[int, int]:
        """vLLM's own prefix-cache counters (tokens found cached, tokens looked up), from its Prometheus metrics; 0
        where it keeps none. vLLM registers one set of collectors per process: with a second `LLM` in the process the
        first one's counters are no longer read (production runs one engine per process)."""
        get = getattr(self.llm, "get_metrics", None)
        if get is None:
            return 0, 0
        metrics = get()
        count = lambda name: int(sum(getattr(m, "value", 0) for m in metrics if m.name == name))  # noqa: E731
        return count("vllm:prefix_cache_hits"), count("vllm:prefix_cache_queries")

    def stats(self) -> dict[str, float]:
        """The counters, and `rollout/prefix_cache_hit_rate`: the share of the prompt tokens looked up in the prefix
        cache that it held (a group's G samples share their prompt; a hybrid model's cache holds whole blocks only,
        `vlgrpo plan` says how large)."""
        out = super().stats()
        queried = self._counts["prefix_cache_query_tokens"]
        if queried:
            out["rollout/prefix_cache_hit_rate"] = self._counts["prefix_cache_hit_tokens"] / queried
        return out

    def update_weights(self, named_params: Iterable[tuple[str, Tensor]] | Adapter | None, version: int) -> None:
        """Reload (HF name, tensor) pairs in place on every worker (vLLM's `reload_weights`, which also resets the
        workers' encoder and multimodal caches), refresh a tied LM head, then reset the prefix cache and the
        scheduler's encoder-cache bookkeeping (else it believes stale image embeddings are still cached). An
        `Adapter` instead becomes the policy's LoRA request (`_take_adapter`): the base weights stay as loaded."""
        if isinstance(named_params, Adapter):
            self._take_adapter(named_params, version)
            return
        self.wake_up(tags=["weights"])  # weights before the KV cache: vLLM's sleep-mode order
        pushed = {"params": 0, "visual": False}
        if named_params is not None:
            weights = checkpoint_weights(named_params, self.push_visual, pushed)
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
            if self.tied_embeddings:
                self.llm.collective_rpc(_refresh_tied_lm_head)
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()
        self._counts["weight_syncs"] += 1
        self._counts["params_pushed"] += pushed["params"]
        self.policy_version = int(version)
        if self.cache is not None:
            self.cache.set_step(int(version))

    def _take_adapter(self, adapter: Adapter, version: int) -> None:
        """Version `version`'s adapter as a LoRA request named `policy-v{version}`. vLLM keys its prefix cache by the
        adapter, so no entry of an older policy is reused, and holds `max_loras` adapters, so groups of older versions
        in flight finish on theirs (TRL's async trainer names its adapters by version for the same reasons). vLLM
        loads an adapter from a directory in PEFT's form (`AdapterVersions`)."""
        from vllm.lora.request import LoRARequest

        if not self.max_loras:
            raise RuntimeError("this vLLM engine was built without LoRA (enable_lora): it cannot take an adapter")
        path = self._adapters.write(adapter, version)
        self.lora_request = LoRARequest(f"policy-v{version}", version + 1, path)
        self._counts["adapter_syncs"] += 1
        self.policy_version = int(version)
        if self.cache is not None:
            self.cache.set_step(int(version))

    def sleep(self, level: int = 1) -> None:
        """Colocated mode: free vLLM's GPU memory for the update (level 1 keeps weights in CPU RAM). vLLM's sleep
        needs the engine fully awake; a second sleep is a no-op."""
        if not self.asleep:
            self.llm.sleep(level=level)
            self.asleep = set(SLEEP_TAGS)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Wake the named allocations (all when None) that are asleep, weights before the KV cache, each once:
        vLLM refuses (warns and does nothing) a tag that is already awake, and memory is never mapped twice."""
        for tag in SLEEP_TAGS:
            if tag in self.asleep and (tags is None or tag in tags):
                self.llm.wake_up(tags=[tag])
                self.asleep.discard(tag)
