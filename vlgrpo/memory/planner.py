"""Per-GPU memory of a GRPO run: the terms (`terms`) added into the peak of the update and of the rollout, the CPU
memory offload takes, the counts behind them, and the conventions each figure uses.

Pure arithmetic on a small `PlanInput` (no torch, no config tree: `from_config.plan_input_from_config` maps the
config onto it); whether the peaks fit a GPU type is `fit`. Every formula and assumption is written out in
docs/memory.md. All sizes are bytes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vlgrpo.memory.inputs import PlanInput, check, train_gpus
from vlgrpo.memory.terms import (
    activation_bytes,
    bytes_per_param,
    logits_bytes,
    model_states,
    param_counts,
    rollout_terms,
    step_features_bytes,
)
from vlgrpo.memory.tokens import prompt_parts, prompt_tokens, visual_tokens


def plan(inp: PlanInput) -> dict[str, Any]:
    """Per-GPU and CPU bytes of every term, the phase totals and the conventions used."""
    check(inp)
    total, trainable, largest = param_counts(inp)
    d, shard = train_gpus(inp), train_gpus(inp) if inp.zero_stage == 3 else 1
    states = model_states(inp, trainable, total)
    ref = total * inp.dtype_bytes // shard if inp.beta > 0 and not inp.lora_rank else 0  # LoRA: adapter disabled
    reward = inp.reward_model_params * inp.dtype_bytes // shard
    seq = prompt_tokens(inp) + inp.completion_tokens
    roll = rollout_terms(inp, total - trainable if inp.lora_rank else total)  # vLLM holds merged LoRA weights
    # ZeRO-3 gathers one full layer at a time: DeepSpeed's estimator counts it at 4 B, the 16-byte plan at the dtype
    gather = largest * (4 if inp.convention == "18-byte" else inp.dtype_bytes) if inp.zero_stage == 3 else 0
    g = {
        **states["gpu"],
        "model_states": sum(states["gpu"].values()),
        "zero3_gather": gather,
        "reference": 0 if "reference" in inp.offload else ref,
        "reward_model": 0 if "reward" in inp.offload else reward,
        "critic": sum(states["gpu"].values()) if inp.critic else 0,  # PPO: a value model mirroring the actor
        "activations": activation_bytes(inp, seq),
        # the step's prompts' activations, kept from the rollout's prefill through the decode and the update
        "kept_prefill": activation_bytes(replace(inp, micro_batch=inp.prompts_per_step), prompt_tokens(inp))
        if inp.kept_prefill
        else 0,
        "logits": logits_bytes(inp),
        **roll,
        "vision_cache": inp.vision_cache_bytes + step_features_bytes(inp),
        "overhead": inp.overhead_bytes,
    }
    resident = sum(
        g[k] for k in ("weights", "optimizer", "reference", "reward_model", "critic", "vision_cache", "overhead")
    )
    g["train_phase"] = resident + sum(
        g[k] for k in ("gradients", "zero3_gather", "activations", "logits", "kept_prefill")
    )
    split = inp.engine == "vllm" and inp.vllm_placement == "split"
    # ZeRO-3 training GPUs gather weights during rollout (the trainer's `rollout_weights`): the whole policy when the
    # HF engine decodes with it, only the vision tower + merger when vLLM decodes with its own copy.
    vision = (inp.spec.vision_params() + inp.spec.merger_params()) if inp.spec else 0
    gathered = vision if inp.engine == "vllm" else total
    g["zero3_rollout_gather"] = gathered * inp.dtype_bytes * (d - 1) // d if inp.zero_stage == 3 and not split else 0
    g["rollout_phase"] = (
        (g["overhead"] if split else resident)
        + g["zero3_rollout_gather"]
        + roll["rollout_weights"]
        + roll["kv_cache"]
        + g["kept_prefill"]
    )
    g["total"] = max(g["train_phase"], g["rollout_phase"])
    cpu = {
        **states["cpu"],
        "reference": ref if "reference" in inp.offload else 0,
        "reward_model": reward if "reward" in inp.offload else 0,
        "rollout_weights_asleep": roll["rollout_weights"]
        if not split and inp.engine == "vllm" and inp.vllm_sleep
        else 0,
    }  # vLLM's sleep level 1 parks its weights in CPU memory during the update
    cpu["per_rank"] = sum(cpu.values())
    cpu["all_ranks"] = cpu["per_rank"] * d
    parts, prompt = prompt_parts(inp), prompt_tokens(inp)
    warnings = (
        []
        if prompt <= inp.max_prompt_length
        else [
            f"prompt of {prompt} tokens ({' + '.join(f'{k} {v}' for k, v in parts.items() if v)}) exceeds "
            f"data.max_prompt_length={inp.max_prompt_length}: training skips such rows (counted in "
            "data/overlong_rows), "
            "never cutting inside an image or a video"
        ]
    )
    counts = {
        "total_params": total,
        "trainable_params": trainable,
        "largest_layer_params": largest,
        "train_gpus": d,
        "prompt_parts": parts,
        "prompt_tokens": prompt,
        "visual_tokens": visual_tokens(inp),
        "sequence_tokens": seq,
    }
    return {"counts": counts, "per_gpu": g, "cpu": cpu, "conventions": conventions(inp), "warnings": warnings}


def conventions(inp: PlanInput) -> dict[str, str]:
    """Which convention each figure uses, in words (also printed under the table)."""
    b = bytes_per_param(inp)
    ds = inp.convention == "18-byte"
    return {
        "model_states": f"{inp.convention} convention: {b['weights']} B weights + {b['gradients']} B gradients + "
        f"{b['optimizer']} B optimiser states per trainable parameter"
        + (" (DeepSpeed's estimators: bf16 + fp32 gradients)" if ds else ""),
        "zero3_gather": f"ZeRO-3 only: largest layer x {4 if ds else inp.dtype_bytes} B"
        + (" (DeepSpeed's estimator)" if ds else ""),
        "units": "bytes; printed GB are decimal (1 GB = 1e9 B)",
        "activations": "flash/SDPA attention (no T^2 term); with checkpointing only each layer's input is kept",
        "logits": "lm_head output + fp32 copy + fp32 log_softmax on the completion tokens (gradient checkpointing "
        "forwards whole rows but keeps the prompt's positions out of the lm_head)",
        "kv_cache": "2 x attention layers x kv_heads x head_dim x bytes per token; a group's prompt is stored once; "
        "Qwen3.5's Gated DeltaNet layers: a fixed recurrent + conv state per sequence instead",
        "visual_tokens": "every image of a prompt and its video (frames / temporal patch x tokens per frame) in the "
        "prompt, the tower's patches (x merge^2) and the step's cached features",
        "zero3_rollout_gather": "ZeRO-3, colocated: the rest of the vision tower + merger (vLLM engine) or of the "
        "whole policy (HF engine) gathered on every training GPU during rollout",
    }
