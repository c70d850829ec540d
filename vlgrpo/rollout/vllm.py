"""vLLM rollout backend, and the only module that imports vllm (lazily, inside `VLLMEngine.launch`).

Prompts carry our cached image embeddings + grid (or PIL images), `SamplingParams(n=G)` samples a group per request,
prefix caching shares the prompt. Weight sync pushes the trainer's tensors through `load_weights`, then resets the
prefix cache and, when `visual.*` changed, the encoder cache (which `reset_prefix_cache` does not clear). After each
sync the sampled log-probs are compared with the trainer's (`rollout/logprob_abs_diff`). Knows nothing of rewards.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterable, Iterator

import torch
from torch import Tensor

from vlgrpo.data.images import ProcessorGeometry, image_sha256, load_image
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.inputs import (
    PromptInputs,
    build_prompt,
    collate_groups,
    completion_logprobs,
    forbidden_mask,
    vocab_size,
)
from vlgrpo.types import Completion, RolloutGroup, Sample

MM_INPUTS = ("embeds", "pixels")
PLACEHOLDER_BIAS = -1.0e4  # exp(-1e4) == 0 in fp32: the same distribution as a -inf mask
_WRAPPER_PREFIXES = ("module.", "base_model.model.", "_orig_mod.")
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "base_layer.", "modules_to_save.default.")


# ---------------------------------------------------------------- pure helpers (tested on the CPU)


def vllm_param_name(name: str) -> str | None:
    """HF/peft/DeepSpeed parameter name -> the checkpoint name vLLM's `load_weights` accepts; None = do not push.

    LoRA factors (`lora_A/B`, `lora_embedding_*`) and peft's `original_module` copies are skipped: after
    `merge_adapter()` the merged weight sits in `base_layer`, whose name maps to the plain checkpoint name.
    """
    if "lora_" in name or ".original_module." in name:
        return None
    for prefix in _WRAPPER_PREFIXES:
        while name.startswith(prefix):
            name = name[len(prefix) :]
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def is_visual(name: str) -> bool:
    """True for parameters of the vision tower (merger included)."""
    return ".visual." in f".{name}"


def sampling_kwargs(params: SamplingParams, forbidden_ids: list[int]) -> dict:
    """Keyword arguments of `vllm.SamplingParams` for our params (greedy runs n=1; the engine copies the result)."""
    return {
        "n": 1 if params.greedy else params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop) or None,
        "seed": params.seed,
        "logprobs": 0,  # the sampled token's log-prob (logprobs_mode=processed_logprobs: after temperature)
        "logit_bias": {int(i): PLACEHOLDER_BIAS for i in forbidden_ids},
        "skip_special_tokens": True,
    }


def build_request(prompt: PromptInputs, features=None, mm_input: str = "embeds") -> dict:
    """One vLLM prompt: our token ids (image pads already expanded) plus the image as embeddings or pixels."""
    if mm_input == "embeds":
        if features is None:
            raise ValueError("mm_input='embeds' needs the image's cached features")
        image = {"image_embeds": features.embeds, "image_grid_thw": features.grid_thw.reshape(1, 3)}
        return {"prompt_token_ids": list(prompt.input_ids), "multi_modal_data": {"image": image}}
    if mm_input == "pixels":
        return {
            "prompt_token_ids": list(prompt.input_ids),
            "multi_modal_data": {"image": load_image(prompt.image)},
            "multi_modal_uuids": {"image": [image_sha256(prompt.image)]},  # skips re-hashing the pixels
        }
    raise ValueError(f"rollout.vllm.mm_input must be one of {', '.join(MM_INPUTS)}, got {mm_input!r}")


def to_completions(output, params: SamplingParams, forbidden_ids: set[int], decode) -> tuple[list[Completion], int]:
    """A vLLM RequestOutput -> G Completions, and how many sampled a vision placeholder.

    A completion that sampled a placeholder is cut just before it and marked finish_reason "placeholder" (the trainer
    masks it); its id must never reach a forward pass ("Image features and image tokens do not match").
    """
    outs = list(output.outputs)
    if params.greedy and params.n > 1:
        outs = outs[:1] * params.n
    completions, bad = [], 0
    for o in outs:
        ids = list(o.token_ids)
        logps = [lp[t].logprob for lp, t in zip(o.logprobs, ids)] if o.logprobs else None
        text, reason = o.text, "stop" if o.finish_reason == "stop" else "length"
        hit = next((i for i, t in enumerate(ids) if t in forbidden_ids), None)
        if hit is not None:
            bad += 1
            ids, logps, reason = ids[:hit], (logps[:hit] if logps else logps), "placeholder"
            text = decode(ids)
        completions.append(Completion(ids, text, reason, logps))
    return completions, bad


def logprob_abs_diff(groups: list[RolloutGroup], trainer_logps: Tensor) -> tuple[float, float]:
    """(mean, max) |engine - trainer| log-prob over the completion tokens; trainer_logps [R, C] in row order."""
    diffs = []
    rows = [c for g in groups for c in g.completions]
    for r, c in enumerate(rows):
        if c.logprobs:
            engine = torch.tensor(c.logprobs, dtype=torch.float32)
            diffs.append((engine - trainer_logps[r, : len(engine)].float().cpu()).abs())
    if not diffs:
        return float("nan"), float("nan")
    d = torch.cat(diffs)
    return float(d.mean()), float(d.max())


@contextlib.contextmanager
def merged_lora(model) -> Iterator[None]:
    """Merge a peft model's adapters into the base weights for the duration of a push, then unmerge."""
    merge = getattr(model, "merge_adapter", None)
    if merge is None:
        yield
        return
    merge()
    try:
        yield
    finally:
        model.unmerge_adapter()


def sync_params(model) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of a local model for `update_weights`; LoRA: inside `merged_lora(model)` (merge -> push ->
    unmerge). ZeRO-3 backends gather each parameter themselves and feed the same names."""
    with merged_lora(model), torch.no_grad():
        for name, p in model.named_parameters():
            if vllm_param_name(name) is not None:
                yield name, p.data


# ---------------------------------------------------------------- the engine


def _vllm_model(llm):
    """The in-process model of an `LLM` built with an in-process executor (as TRL's colocate mode does)."""
    worker = llm.llm_engine.model_executor.driver_worker
    runner = getattr(getattr(worker, "worker", worker), "model_runner", None) or worker.model_runner
    return runner.model


class VLLMEngine:
    """RolloutEngine on a vLLM `LLM`. `check_model`: the trainer's policy, for the post-sync log-prob check."""

    def __init__(self, llm, processor, vision_cache=None, answer_format: str = "think_answer",
                 box_format: str = "qwen2_5", system_prompt: str = "", mm_input: str = "embeds",
                 push_visual: bool = True, sleep_level: int = 0, check_model=None, check_groups: int = 1):  # fmt: skip
        if mm_input not in MM_INPUTS:
            raise ValueError(f"rollout.vllm.mm_input must be one of {', '.join(MM_INPUTS)}, got {mm_input!r}")
        if mm_input == "embeds" and vision_cache is None:
            raise ValueError("rollout.vllm.mm_input=embeds needs a VisionCache")
        self.llm, self.processor, self.cache, self.mm_input = llm, processor, vision_cache, mm_input
        self.prompt_kw = dict(answer_format=answer_format, box_format=box_format, system_prompt=system_prompt)
        self.geometry = ProcessorGeometry.from_processor(processor)
        self.forbidden_ids = sorted(set(torch.nonzero(forbidden_mask(processor.tokenizer, len(processor.tokenizer)))
                                        .flatten().tolist()))  # fmt: skip
        self.push_visual, self.sleep_level = push_visual, sleep_level
        self.check_model, self.check_groups = check_model, check_groups
        self.policy_version, self.sleeping, self._check_pending = 0, False, False
        self.reset_stats()

    @classmethod
    def launch(cls, model_path: str, processor, vision_cache=None, *, mm_input: str = "embeds",
               gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1, max_model_len: int = 4096,
               enable_sleep_mode: bool = False, seed: int = 0, llm_kwargs: dict | None = None,
               **engine_kw):  # fmt: skip
        """Build the `LLM` (prefix caching on, image embeddings accepted, one image per prompt) and wrap it.

        The engine core runs in this process (as in TRL's colocate mode) so `update_weights` reaches the model.
        """
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM  # the project's only vllm import

        llm = LLM(
            model=model_path, enable_prefix_caching=True, enable_mm_embeds=(mm_input == "embeds"),
            limit_mm_per_prompt={"image": 1, "video": 0}, logprobs_mode="processed_logprobs",
            gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len, enable_sleep_mode=enable_sleep_mode, seed=seed, **(llm_kwargs or {}),
        )  # fmt: skip
        return cls(llm, processor, vision_cache, mm_input=mm_input, **engine_kw)

    @classmethod
    def from_config(cls, cfg, lm, vision_cache, box_format: str) -> "VLLMEngine":
        """The engine a run config asks for (`rollout.vllm.*`); `lm` is the trainer's LoadedModel (log-prob check)."""
        v, m = cfg.rollout.vllm, cfg.model
        colocate = v.placement == "colocate"
        llm_kwargs = {"dtype": m.dtype}
        if colocate and torch.distributed.is_available() and torch.distributed.is_initialized():
            llm_kwargs["distributed_executor_backend"] = "external_launcher"  # one engine per training rank
        return cls.launch(
            m.name_or_path, lm.processor, vision_cache, mm_input=v.mm_input,
            gpu_memory_utilization=v.gpu_memory_utilization, tensor_parallel_size=v.tensor_parallel_size,
            max_model_len=cfg.data.max_prompt_length + cfg.rollout.max_new_tokens,
            enable_sleep_mode=colocate and v.enable_sleep_mode, seed=cfg.train.seed, llm_kwargs=llm_kwargs,
            answer_format=cfg.data.answer_format, box_format=box_format, system_prompt=cfg.data.system_prompt,
            push_visual=not (m.freeze_vision and m.freeze_merger),
            sleep_level=1 if colocate and v.enable_sleep_mode else 0, check_model=lm.model,
        )  # fmt: skip

    def generate(self, samples: list[Sample], params: SamplingParams) -> list[RolloutGroup]:
        from vllm import SamplingParams as VLLMSamplingParams

        prompts = [build_prompt(s, self.processor, self.geometry, **self.prompt_kw) for s in samples]
        feats = self._features(prompts) if self.mm_input == "embeds" else [None] * len(prompts)
        requests = [build_request(p, f, self.mm_input) for p, f in zip(prompts, feats)]
        self.wake_up()
        outputs = self.llm.generate(requests, VLLMSamplingParams(**sampling_kwargs(params, self.forbidden_ids)),
                                    use_tqdm=False)  # fmt: skip
        if self.sleep_level:
            self.sleep(self.sleep_level)
        groups = []
        for s, p, out in zip(samples, prompts, outputs):
            completions, bad = to_completions(out, params, set(self.forbidden_ids), self._decode)
            self._counts["placeholder_sampled"] += bad
            self._counts["prefill_tokens"] += len(p.input_ids)
            self._counts["generated_tokens"] += sum(len(c.token_ids) for c in completions)
            groups.append(RolloutGroup(s, list(p.input_ids), completions, self.policy_version))
        self._counts["prompts"] += len(samples)
        self._counts["completions"] += len(samples) * params.n
        if self._check_pending and self.check_model is not None:
            self._check_logprobs(groups[: self.check_groups], params)
        return groups

    def _decode(self, ids: list[int]) -> str:
        return self.processor.tokenizer.decode(ids, skip_special_tokens=True)

    def _features(self, prompts: list[PromptInputs]):
        before = self.cache.stats()
        feats = self.cache.get([p.image for p in prompts])
        for key in ("encoder_calls", "images_encoded"):
            self._counts[key] += self.cache.stats()[key] - before[key]
        return feats

    def _check_logprobs(self, groups: list[RolloutGroup], params: SamplingParams) -> None:
        """Trainer log-probs of the sampled tokens vs vLLM's, once after each weight sync."""
        model, tok = self.check_model, self.processor.tokenizer
        feats = self.cache.get([g.sample.image for g in groups]) if self.cache else None
        if feats is None or not any(c.token_ids for g in groups for c in g.completions):
            return
        device = next(model.parameters()).device
        batch = collate_groups(groups, [f.grid_thw for f in feats], tok.pad_token_id,
                               tok.convert_tokens_to_ids("<|image_pad|>"), device)  # fmt: skip
        forbidden = forbidden_mask(tok, vocab_size(model), device)
        with torch.no_grad():
            logps = completion_logprobs(model, batch, feats, forbidden, params.temperature or 1.0)
        mean, worst = logprob_abs_diff(groups, logps)
        self._metrics.update({"rollout/logprob_abs_diff": mean, "rollout/logprob_abs_diff_max": worst})
        self._check_pending = False

    def update_weights(self, named_params: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Push (HF name, tensor) pairs, then reset the prefix cache and, if `visual.*` changed, the encoder cache."""
        self.wake_up(tags=["weights"])
        model = _vllm_model(self.llm)
        pushed, visual = 0, False
        for name, tensor in named_params:
            vname = vllm_param_name(name)
            if vname is None or (is_visual(vname) and not self.push_visual):
                continue
            model.load_weights([(vname, tensor)])
            pushed += 1
            visual = visual or is_visual(vname)
        self.llm.reset_prefix_cache()
        if visual:
            reset = getattr(self.llm, "reset_encoder_cache", None) or self.llm.llm_engine.reset_encoder_cache
            reset()
        self._counts["weight_syncs"] += 1
        self._counts["params_pushed"] += pushed
        self.policy_version, self._check_pending = int(version), True
        if self.cache is not None:
            self.cache.set_step(int(version))

    def sleep(self, level: int = 1) -> None:
        """Colocated mode: free vLLM's GPU memory for the update (level 1 keeps weights in CPU RAM)."""
        if not self.sleeping:
            self.llm.sleep(level=level)
            self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        if self.sleeping:
            self.llm.wake_up(tags=tags) if tags else self.llm.wake_up()
            self.sleeping = tags is not None and "kv_cache" not in tags

    def stats(self) -> dict[str, float]:
        return {**{f"rollout/{k}": v for k, v in self._counts.items()}, **self._metrics}

    def reset_stats(self) -> None:
        keys = ("prompts", "completions", "prefill_tokens", "generated_tokens", "encoder_calls", "images_encoded",
                "placeholder_sampled", "weight_syncs", "params_pushed")  # fmt: skip
        self._counts, self._metrics = {k: 0 for k in keys}, {}
