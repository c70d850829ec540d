"""What a run's config hands `vllm.LLM` (through `VLLMEngine.launch`): `launch_args`, the one place the config's
rollout.vllm.* settings, vlgrpo's own defaults for vLLM (`engine_defaults`) and the LoRA adapter's settings become the
engine's arguments. No vllm import: tests read the arguments on the CPU without vLLM.
"""

from __future__ import annotations

import torch

from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.families import family_of
from vlgrpo.memory.from_config import total_length
from vlgrpo.policy.prompt import PromptSettings
from vlgrpo.rollout.adapters import engine_lora_kwargs
from vlgrpo.rollout.turns import with_tool_images


def launch_args(cfg, lm, prompt: PromptSettings) -> dict:
    """`VLLMEngine.launch`'s arguments for a run config (`rollout.vllm.*`, `engine_defaults`, the LoRA adapter's
    settings), besides the checkpoint, processor and vision cache: what reaches `vllm.LLM`."""
    v, m = cfg.rollout.vllm, cfg.model
    colocate = cfg.rollout.placement == "colocate"
    lora = engine_lora_kwargs(cfg)  # vLLM applies the LoRA adapter itself ({} without adapter_sync)
    llm_kwargs = {**lora, **engine_defaults(cfg, family_of(lm.model)), "dtype": m.dtype, **v.engine_kwargs}
    if colocate and torch.distributed.is_available() and torch.distributed.is_initialized():
        llm_kwargs["distributed_executor_backend"] = "external_launcher"  # one engine per training rank
    return dict(
        mm_input=v.mm_input,
        gpu_memory_utilization=v.gpu_memory_utilization,
        tensor_parallel_size=v.tensor_parallel_size,
        max_model_len=prompt.max_total_length or total_length(cfg, ProcessorGeometry.from_processor(lm.processor)),
        enable_sleep_mode=colocate and v.enable_sleep_mode,
        seed=cfg.train.seed,
        llm_kwargs=llm_kwargs,
        limit_mm_per_prompt=with_tool_images(dict(v.limit_mm_per_prompt), prompt.max_turns),
        prompt=prompt,
        push_visual=not (m.freeze_vision and m.freeze_merger),
        sleep_level=1 if colocate and v.enable_sleep_mode else 0,
        max_loras=lora.get("max_loras", 0),
        release_mm_caches=colocate,
    )


def engine_defaults(cfg, family) -> dict:
    """`vllm.LLM` settings vlgrpo chooses for a run (rollout.vllm.engine_kwargs overrides each):
    - colocated: `mm_processor_cache_gb=0`. The processor cache keeps every multimodal item it has seen (with
      mm_input=embeds, our embedding tensors) for reuse across requests; a training run never sends an item twice
      within its lifetime's use, and colocated with the trainer the cache grows into the update's memory (verl turns
      it off for the same reason);
    - a hybrid model (Qwen3.5's Gated DeltaNet): `mamba_cache_mode="align"`, the prefix caching of linear-attention
      state at block boundaries (vLLM sizes the block so a block's attention pages hold a layer's state: hundreds of
      tokens; `vlgrpo plan` prints the size and what share of a prompt it can reuse)."""
    out: dict = {}
    if cfg.rollout.placement == "colocate":
        out["mm_processor_cache_gb"] = 0
    if family.hybrid_attention:
        out["mamba_cache_mode"] = "align"
    return out
