"""The byte formulas of a GRPO run, one per memory consumer: parameter counts, bytes per parameter, model states
after ZeRO sharding and offload, activations, logits, the step's visual features and the rollout's weights and KV cache.

Pure arithmetic on a `PlanInput`; `planner.plan` adds them into phase peaks. Every formula is written out in
docs/memory.md. All sizes are bytes.
"""

from __future__ import annotations

import math

from vlgrpo.memory.inputs import PlanInput, train_gpus
from vlgrpo.memory.specs import PlanError, kv_cache_bytes, lora_params
from vlgrpo.memory.tokens import prompt_tokens, visual_tokens


def param_counts(inp: PlanInput) -> tuple[int, int, int]:
    """(total parameters, trainable parameters, largest layer)."""
    if inp.spec is None:
        if not inp.params or inp.params <= 0:
            raise PlanError("give a model (--model NAME_OR_PATH or model.name_or_path) or --params N > 0")
        return int(inp.params), int(inp.params), inp.largest_layer
    s = inp.spec
    parts = {"vision": s.vision_params(), "merger": s.merger_params(), "language": s.language_params()}
    if inp.lora_rank:  # frozen base + adapters
        adapters = lora_params(s, inp.lora_rank, inp.lora_targets, inp.lora_experts)
        return s.total_params() + adapters, adapters, s.largest_layer_params()
    bad = [p for p in inp.trainable if p not in parts]
    if bad:
        raise PlanError(f"trainable parts {bad} are unknown; accepted: vision, merger, language")
    return s.total_params(), sum(parts[p] for p in inp.trainable), s.largest_layer_params()


def bytes_per_param(inp: PlanInput) -> dict[str, int]:
    """Bytes per trainable parameter of weights, gradients and optimiser states (before sharding)."""
    if inp.optimizer_states not in ("fp32", "bf16"):
        raise PlanError(f"optimizer states {inp.optimizer_states!r}; accepted: fp32, bf16")
    if inp.convention not in ("16-byte", "18-byte"):
        raise PlanError(f"convention {inp.convention!r}; accepted: 16-byte, 18-byte")
    w = 4 if inp.lora_rank else inp.dtype_bytes  # PEFT keeps adapters in fp32 (autocast_adapter_dtype)
    if inp.optimizer_states == "bf16":
        return {"weights": w, "gradients": w, "optimizer": 2 * 2}
    master = 4 if w < 4 else 0  # an fp32 master copy only when the weights are 16-bit
    extra_grad = 0
    if inp.convention == "18-byte" and w < 4:
        # DeepSpeed's estimators: ZeRO-1/2 count 2 B weights + 18 B states (bf16 + fp32 gradients, master, moments);
        # ZeRO-3 counts 18 B in all, i.e. one 4-byte gradient copy next to the 2-byte weights.
        extra_grad = 2 if inp.zero_stage == 3 else 4
    return {"weights": w, "gradients": w + extra_grad, "optimizer": master + 8}


def trainer_optimizer_states(backend: str, dtype_bytes: int) -> str:
    """The optimiser states a trainer backend keeps: fp32 for all of them. plain steps an fp32 master copy of 16-bit
    weights with fp32 moments (trainer.backends.MasterWeights), as DeepSpeed (zero3) does; LoRA adapters are fp32, so
    their moments are too. (`bf16` states, 16-bit moments and no master, stay for planning other trainers.)"""
    return "fp32"


def model_states(inp: PlanInput, trainable: int, total: int) -> dict[str, dict[str, int]]:
    """Weights, gradients and optimiser states on one GPU and in CPU memory, after ZeRO sharding and offload.

    ZeRO-1 shards optimiser states over D GPUs, ZeRO-2 also gradients, ZeRO-3 also weights. Offloading the
    optimiser moves the gradient partitions too from ZeRO-2 on (DeepSpeed's ZeRO-Offload).
    """
    d, bpp, z = train_gpus(inp), bytes_per_param(inp), inp.zero_stage
    weights = trainable * bpp["weights"] + (total - trainable) * inp.dtype_bytes  # frozen part in the model dtype
    terms = {
        "weights": weights / d if z >= 3 else weights,
        "gradients": trainable * bpp["gradients"] / (d if z >= 2 else 1),
        "optimizer": trainable * bpp["optimizer"] / (d if z >= 1 else 1),
    }
    on_cpu = {
        "optimizer": "optimizer" in inp.offload,
        "gradients": "optimizer" in inp.offload and z >= 2,
        "weights": "param" in inp.offload,
    }
    gpu = {k: 0 if on_cpu[k] else int(v) for k, v in terms.items()}
    cpu = {k: int(v) if on_cpu[k] else 0 for k, v in terms.items()}
    return {"gpu": gpu, "cpu": cpu}


def activation_bytes(inp: PlanInput, seq_len: int) -> int:
    """Saved activations of one micro-batch (flash/SDPA attention, so no T² term; docs/memory.md)."""
    s, b, mb = inp.spec, inp.dtype_bytes, inp.micro_batch
    if s is None:
        return 0
    # Per token per decoder layer: norm in, q_proj in, norm in, MLP in (h each); q, attn out (q each); k, v; gate, up,
    # act, product (I each); Qwen3's q_norm / k_norm also keep their inputs (q, kv). Qwen2: q = h, no q/k norms.
    # Qwen3.5's gated attention also keeps its gate and the gated product (2q). Its Gated DeltaNet layers keep, per
    # token: norm in, the projections' input, the conv's input and output (conv dim each), z, the delta rule's output
    # and the gated norm's output (v dim each), and the MLP's (4 I + h); the chunked rule's fp32 intermediates are
    # per 64-token chunk and left out.
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    per_token = 4 * s.hidden + 2 * q + 2 * kv + 4 * s.mlp_width + ((q + kv) if s.qwen3 else 0)
    per_token += 2 * q if s.gated_attention else 0
    vd = s.linear_v_heads * s.linear_v_dim
    per_linear_token = 4 * s.hidden + 2 * s.linear_conv_dim + 3 * vd + 4 * s.mlp_width
    per_layer = b * mb * seq_len * (per_token * s.attention_layers + per_linear_token * s.linear_layers) // s.layers
    lm = (b * s.hidden * mb * seq_len * s.layers + per_layer) if inp.gradient_checkpointing else per_layer * s.layers
    if "vision" not in inp.trainable or inp.lora_rank:
        return lm  # frozen ViT: features come from the cache, no graph through the tower
    patches = mb * visual_tokens(inp) * s.merge**2  # [mb, 4N] ViT tokens before the 2x2 merge: images and video
    mlp = 4 if s.traits.vision_swiglu else 2  # SwiGLU saves gate, up, act, product; GELU MLP saves fc1, act
    per_vit = b * (8 * s.vision_hidden + mlp * s.vision_intermediate) * patches
    vit = (
        (b * s.vision_hidden * patches * s.vision_depth + per_vit)
        if inp.gradient_checkpointing
        else (per_vit * s.vision_depth)
    )
    return lm + vit


def step_features_bytes(inp: PlanInput) -> int:
    """The current step's visual features, B x N x h with N every image's and the video's merged tokens: the merged
    embeddings and, for Qwen3-VL, one DeepStack map of the same shape per DeepStack merger (the vision cache keeps them
    all, the prefill adds them to the first layers)."""
    s = inp.spec
    if s is None:
        return 0
    return inp.prompts_per_step * visual_tokens(inp) * s.hidden * inp.dtype_bytes * (1 + s.deepstack_mergers)


def logits_bytes(inp: PlanInput) -> int:
    """Log-prob pass: lm_head output + fp32 copy + fp32 log_softmax on the completion tokens. Both passes ask the LM
    head for those positions only: the shared-prefix pass by construction, the whole-row pass of gradient
    checkpointing (`policy.forward._completion_logits_full_rows`) through `logits_to_keep`."""
    vocab = inp.spec.vocab if inp.spec else 0
    chunk = min(inp.logits_chunk or inp.completion_tokens, inp.completion_tokens)
    return inp.micro_batch * chunk * vocab * (inp.dtype_bytes + 4 + 4)  # [mb, C, V]


def rollout_terms(inp: PlanInput, engine_params: int) -> dict[str, int]:
    """Engine weights and KV cache on one rollout GPU (HF: the policy's own weights). Both engines keep a group's
    prompt KV once: vLLM by prefix caching, the HF engine's decode reads one copy per prompt for its G rows and
    preallocates each row's completion (`rollout.decode.SharedPrefixDecoder`); with multi-turn rollouts it keeps each
    trajectory's whole KV between turns (`turn_kv`)."""
    s, prompt, c, g = inp.spec, prompt_tokens(inp), inp.completion_tokens, inp.completions_per_prompt
    prompts = inp.prompts_per_step
    if inp.engine == "vllm" and inp.vllm_placement == "split":  # vLLM GPUs serve every training rank's prompts
        prompts = math.ceil(prompts * train_gpus(inp) / max(inp.rollout_gpus, 1))
    if inp.engine == "vllm":
        weights = engine_params * inp.dtype_bytes // inp.tensor_parallel
    else:
        weights = 0
    tokens = prompts * (prompt + g * c)  # the prompt's KV is stored once per group
    if inp.turn_kv:  # and again in each trajectory's KV, kept from turn to turn (`rollout.decode.TurnKV`)
        tokens += prompts * g * prompt
    kv = 0 if s is None else kv_cache_bytes(s.attention_layers, s.kv_heads, s.head_dim, 1, tokens, inp.dtype_bytes)
    if s is not None and s.linear_layers:  # Gated DeltaNet: a fixed state per sequence (each row's and the prompt's)
        kv += prompts * (g + 1) * s.state_bytes_per_sequence(inp.dtype_bytes)
    return {"rollout_weights": weights, "kv_cache": kv // inp.tensor_parallel}
