"""What a run writes and sends besides GPU memory: the size of one checkpoint (weights, optimiser states, adapter) and
its write time at a stated bandwidth, and the bytes of one weight sync to a rollout engine with its own copy.

Plain arithmetic over the plan's parameter counts, like the rest of the planner; knows the backends' file contents:
- plain: the whole model in its dtype, AdamW's two fp32 moments per trainable weight and, for 16-bit weights, their
  fp32 master copy (trainer.backends.MasterWeights);
- lora: the adapter (fp32) and its two moments, never the base;
- zero3: DeepSpeed's partitions of the fp32 master copy and both moments (12 bytes per trainable weight) plus the
  frozen weights in the model dtype.
"""

from __future__ import annotations

from vlgrpo.memory.inputs import PlanInput

DEFAULT_WRITE_GBPS = 1.0
"""A stated write bandwidth (GB/s) for the write time: a shared network filesystem; a local NVMe writes 2-5x faster."""


def checkpoint_bytes(inp: PlanInput, total: int, trainable: int) -> dict[str, int]:
    """Bytes of one checkpoint by part (`weights`, `optimizer`, `adapter`) and their `total`."""
    frozen = total - trainable
    if inp.lora_rank:
        parts = {"weights": 0, "adapter": trainable * 4, "optimizer": trainable * 8}
    elif inp.zero_stage == 3:
        parts = {"weights": frozen * inp.dtype_bytes, "adapter": 0, "optimizer": trainable * 12}
    else:
        master = 4 if inp.dtype_bytes < 4 else 0
        parts = {"weights": total * inp.dtype_bytes, "adapter": 0, "optimizer": trainable * (8 + master)}
    return {**parts, "total": sum(parts.values())}


DEFAULT_SYNC_GBPS = {"colocate": 200.0, "split": 25.0, "host": 10.0}
"""Stated bandwidths (GB/s) for a sync's time: colocate, a copy within the GPU's memory (a share of an A100's 1.5-2
TB/s, the reload's per-layer work included); split, NCCL from a training GPU to a rollout GPU (PCIe 4 x16; NVLink is
several times faster); host, the path before buckets: a copy to a CPU buffer and on to the rollout GPU (two PCIe
crossings)."""


def sync_bytes(inp: PlanInput, total: int, trainable: int) -> dict[str, int]:
    """Bytes one weight sync sends to an engine with its own weights (vLLM, or a split worker):
    - `full`: what the bucketed sync sends (rollout.weight_stream): the weights that change and their sibling
      layers, in the model's dtype: a full fine-tune's trainable weights; LoRA's merged layers, the language model's
      blocks (every target of the default set; a narrower set sends its blocks' attention or MLP only: an upper
      bound here);
    - `whole`: the whole model (what every sync sent before buckets);
    - `adapter`: a LoRA adapter alone in fp32 (0 without LoRA), what the adapter-only sync sends
      (`PlanInput.adapter_sync`)."""
    base = total - trainable if inp.lora_rank else total
    if inp.lora_rank:
        spec = inp.spec
        blocks = (
            spec.language_params() - spec.vocab * spec.hidden * (1 if spec.tie_embeddings else 2) - spec.hidden
            if spec is not None
            else base
        )
        changing = blocks
    else:
        changing = trainable
    return {
        "full": changing * inp.dtype_bytes,
        "whole": base * inp.dtype_bytes,
        "adapter": trainable * 4 if inp.lora_rank else 0,
    }


def sync_seconds(size: int, path: str) -> float:
    """A sync of `size` bytes along `path` (DEFAULT_SYNC_GBPS)."""
    return size / (DEFAULT_SYNC_GBPS[path] * 1e9)


def write_seconds(size: int, gbps: float = DEFAULT_WRITE_GBPS) -> float:
    return size / (gbps * 1e9)
