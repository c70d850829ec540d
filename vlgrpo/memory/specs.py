"""Model specs for the memory planner: architecture numbers and parameter counts of Qwen2-VL / Qwen2.5-VL / Qwen3-VL /
Qwen3.5 (where a spec comes from, the released checkpoints' table or a local `config.json`: `memory/models.py`). The
counts come from the architecture formulas (checked against transformers in the tests), which branch on each family's
traits in `vlgrpo.families`. Pure arithmetic: no torch, no weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlgrpo.families import FAMILIES, Family
from vlgrpo.types import InputError

LM_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
LINEAR_ATTENTION_LINEARS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
"""Qwen3.5's Gated DeltaNet projections (no such layer in the other families: they count zero there)."""
VISION_LINEARS = ("qkv", "proj", "fc1", "fc2", "visual.gate_proj", "visual.up_proj", "visual.down_proj")


class PlanError(InputError):
    """An input the planner cannot use; the message names the flag, key or file and the accepted values."""


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoint (language model, vision tower, mergers)."""

    name: str
    family: str
    """qwen2_vl (LayerNorm, GELU MLP in the ViT), qwen2_5_vl (RMSNorm, SwiGLU MLP in the ViT), qwen3_vl (LayerNorm,
    GELU MLP, learned position embeddings and DeepStack mergers in the ViT; Qwen3 attention in the language model) or
    qwen3_5 (Qwen3-VL's ViT without DeepStack; gated Qwen3 attention in every `full_attention_interval`-th layer, Gated
    DeltaNet in the others)."""
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    vision_depth: int = 32
    vision_hidden: int = 1280
    vision_intermediate: int = 3420
    patch: int = 14
    merge: int = 2
    temporal_patch: int = 2
    in_channels: int = 3
    position_embeddings: int = 0
    """Rows of the ViT's learned position table (Qwen3-VL's num_position_embeddings; 0: none)."""
    deepstack_mergers: int = 0
    """Qwen3-VL: one merger per deepstack_visual_indexes entry, each the main merger's size with its LayerNorm after
    the 2x2 shuffle (Qwen3VLVisionPatchMerger(use_postshuffle_norm=True))."""
    min_pixels: int | None = None
    """The processor's smallest image area when the spec knows it (init-tiny's); None: the checkpoint directory's
    processor files, else the released processors' bounds of the family (`vlgrpo.data.images.checkpoint_geometry`)."""
    max_pixels: int | None = None
    """The processor's largest image area when the spec knows it; None as for min_pixels."""
    linear_layers: int = 0
    """Qwen3.5: the Gated DeltaNet layers (3 of every 4); the others are full (gated) attention."""
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    conv_kernel: int = 4
    experts: int = 0
    """Mixture of experts (qwen3_vl_moe, qwen3_5_moe): routed experts per decoder layer; 0 for a dense MLP."""
    experts_per_token: int = 0
    """The router's top-k."""
    moe_intermediate: int = 0
    """One routed expert's MLP width."""
    shared_expert_intermediate: int = 0
    """Qwen3.5-MoE's gated shared expert's MLP width (0: none)."""

    @property
    def traits(self) -> Family:
        """What the family shares with its relatives (`vlgrpo.families`): the formulas below branch on it."""
        return FAMILIES[self.family]

    @property
    def qwen3(self) -> bool:
        """Qwen3 attention (no biases, q/k norms) and Qwen3-VL's tower (a conv bias, learned positions)."""
        return self.traits.qwen3

    @property
    def attention_layers(self) -> int:
        return self.layers - self.linear_layers

    @property
    def gated_attention(self) -> bool:
        """Qwen3.5's attention: q_proj emits each head's query and its output gate (twice the query width)."""
        return self.traits.gated_attention

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a Gated DeltaNet's causal convolution: queries, keys and values."""
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim

    def linear_attention_params(self) -> int:
        """One Gated DeltaNet layer's token mixer: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, the depthwise conv
        (no bias), dt_bias, A_log, the gated RMSNorm over a value head and out_proj."""
        h, vd, hv = self.hidden, self.linear_v_heads * self.linear_v_dim, self.linear_v_heads
        conv = self.linear_conv_dim
        return h * conv + h * vd + 2 * h * hv + conv * self.conv_kernel + 2 * hv + self.linear_v_dim + vd * h

    def state_bytes_per_sequence(self, dtype_bytes: int) -> int:
        """A Gated DeltaNet's state of one sequence over every linear layer: the recurrent state (v heads x k dim x v
        dim, fp32 as the released configs' mamba_ssm_dtype and transformers keep it) and the conv window (conv dim x
        kernel, in the model's dtype); it replaces those layers' KV cache and does not grow with the sequence."""
        recurrent = self.linear_v_heads * self.linear_k_dim * self.linear_v_dim * 4
        return self.linear_layers * (recurrent + self.linear_conv_dim * self.conv_kernel * dtype_bytes)

    def prefix_block_tokens(self, dtype_bytes: int, kernel_block: int = 16) -> int:
        """The block vLLM's prefix caching uses for a hybrid model (0 for one without linear layers): a block's
        attention page (2 x kv heads x head dim x bytes per token) must hold one Gated DeltaNet layer's state, and its
        "align" mode caches that state at block boundaries only, so only whole blocks of a shared prompt are reused.
        vLLM's arithmetic (platforms.interface `_align_hybrid_block_size`): the smallest multiple of the attention
        kernel's block (16 tokens on the GPU backends) whose page holds the state. Qwen3.5-9B: 528 tokens."""
        if not self.linear_layers:
            return 0
        per_token = 2 * self.kv_heads * self.head_dim * dtype_bytes
        state = self.state_bytes_per_sequence(dtype_bytes) // self.linear_layers
        return kernel_block * -(-state // (kernel_block * per_token))

    def mlp_params(self) -> int:
        """One decoder layer's feed-forward: a SwiGLU MLP (gate/up/down), or a MoE block: the router (E x h), every
        expert's fused gate/up and down projections, and Qwen3.5-MoE's shared expert with its one-output gate."""
        h = self.hidden
        if not self.experts:
            return 3 * h * self.intermediate
        shared = 3 * h * self.shared_expert_intermediate + h if self.shared_expert_intermediate else 0
        return self.experts * h + self.experts * 3 * h * self.moe_intermediate + shared

    @property
    def mlp_width(self) -> int:
        """The MLP width a token runs through (its activations): a dense MLP's, or its k experts' and the shared
        expert's."""
        if not self.experts:
            return self.intermediate
        return self.experts_per_token * self.moe_intermediate + self.shared_expert_intermediate

    def active_params(self) -> int:
        """Parameters a token runs through: all of a dense model; a MoE's without the experts it is not routed to."""
        idle = self.experts - self.experts_per_token
        return self.total_params() - self.layers * idle * 3 * self.hidden * self.moe_intermediate

    def routing_bytes(self, tokens: int) -> int:
        """A rollout's routing record (`policy.routing`): one byte per expert index (two past 256 experts), k per
        token per MoE layer; 0 for a dense model."""
        if not self.experts:
            return 0
        return tokens * self.layers * self.experts_per_token * (1 if self.experts <= 256 else 2)

    def language_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = h * q * (2 if self.gated_attention else 1) + 2 * h * kv + q * h  # q (+ gate), k, v, o_proj weights
        # Qwen2: q/k/v biases. Qwen3: no biases, an RMSNorm over each head's queries and keys (q_norm, k_norm)
        attn += 2 * self.head_dim if self.qwen3 else q + 2 * kv
        rest = self.mlp_params() + 2 * h  # SwiGLU gate/up/down (or the MoE block) + two RMSNorms
        mixers = self.attention_layers * attn + self.linear_layers * self.linear_attention_params()
        embeddings = self.vocab * h * (1 if self.tie_embeddings else 2)  # embed_tokens (+ lm_head unless tied)
        return mixers + self.layers * rest + embeddings + h  # + final norm

    def vision_params(self) -> int:
        """ViT blocks, the conv3d patch embedding and Qwen3-VL's position table (the mergers are counted apart)."""
        hv, iv, swiglu = self.vision_hidden, self.vision_intermediate, self.traits.vision_swiglu
        norms = 2 * (hv if swiglu else 2 * hv)  # Qwen2.5-VL's RMSNorm has no bias, LayerNorm has one
        attn = (hv * 3 * hv + 3 * hv) + (hv * hv + hv)
        mlp = 2 * (hv * iv + iv) + (iv * hv + hv) if swiglu else (hv * iv + iv) + (iv * hv + hv)
        patch_embed = self.in_channels * self.temporal_patch * self.patch * self.patch * hv + (hv if self.qwen3 else 0)
        return self.vision_depth * (norms + attn + mlp) + patch_embed + self.position_embeddings * hv

    def merger_params(self) -> int:
        """The patch merger, and Qwen3-VL's DeepStack mergers (the trainer's `merger` part holds both)."""
        m = self.vision_hidden * self.merge**2  # 2x2 neighbouring patches concatenated
        linears = (m * m + m) + (m * self.hidden + self.hidden)
        ln = self.vision_hidden if self.traits.vision_swiglu else 2 * self.vision_hidden  # LayerNorm: + bias
        return ln + linears + self.deepstack_mergers * (2 * m + linears)  # DeepStack: LayerNorm over 4 hv

    def total_params(self) -> int:
        return self.language_params() + self.vision_params() + self.merger_params()

    def largest_layer_params(self) -> int:
        """Largest single module (DeepSpeed's `largest_layer_params`): the embedding / lm_head for Qwen."""
        h, q, hv, iv, m = (
            self.hidden,
            self.heads * self.head_dim,
            self.vision_hidden,
            self.vision_intermediate,
            self.vision_hidden * self.merge**2,
        )
        return max(
            self.vocab * h,
            h * self.intermediate,
            h * q * (2 if self.gated_attention else 1) + (0 if self.qwen3 else q),  # embedding / lm_head, MLP, q_proj
            self.experts * 3 * h * self.moe_intermediate,  # a MoE's fused experts: one module, both projections
            h * self.linear_conv_dim,  # Qwen3.5's in_proj_qkv
            self.in_channels * self.temporal_patch * self.patch**2 * hv + (hv if self.qwen3 else 0),  # conv3d
            self.position_embeddings * hv,  # Qwen3-VL's learned position table
            hv * 3 * hv + 3 * hv,
            hv * iv + iv,
            m * m + m,
            m * h + h,  # ViT qkv and MLP linear, merger linears
        )


def lora_params(spec: ModelSpec, rank: int, targets: tuple[str, ...], experts: bool = False) -> int:
    """Adapter parameters r·(in + out) per targeted linear layer (language model; ViT names when listed): attention
    projections in the attention layers, Gated DeltaNet ones in the linear layers (Qwen3.5), the MLP in every one (a
    MoE's MLP names are its shared expert's, none in Qwen3-VL-MoE); `experts`: r per routed expert on its fused
    gate/up (h -> 2 I) and down (I -> h) projections, in every layer (peft's target_parameters)."""
    h, kv, q = spec.hidden, spec.kv_heads * spec.head_dim, spec.heads * spec.head_dim
    i = spec.shared_expert_intermediate if spec.experts else spec.intermediate
    mlp_layers = spec.layers if i else 0
    hv, iv = spec.vision_hidden, spec.vision_intermediate
    vd, v_heads = spec.linear_v_heads * spec.linear_v_dim, spec.linear_v_heads
    attention = spec.attention_layers
    lm = {  # (in + out, layers that have it)
        "q_proj": (h + q * (2 if spec.gated_attention else 1), attention),
        "k_proj": (h + kv, attention),
        "v_proj": (h + kv, attention),
        "o_proj": (q + h, attention),
        "gate_proj": (h + i, mlp_layers),
        "up_proj": (h + i, mlp_layers),
        "down_proj": (i + h, mlp_layers),
        "in_proj_qkv": (h + spec.linear_conv_dim, spec.linear_layers),
        "in_proj_z": (h + vd, spec.linear_layers),
        "in_proj_b": (h + v_heads, spec.linear_layers),
        "in_proj_a": (h + v_heads, spec.linear_layers),
        "out_proj": (vd + h, spec.linear_layers),
    }
    vit = {
        "qkv": 4 * hv,
        "proj": 2 * hv,
        "fc1": hv + iv,
        "fc2": iv + hv,
        "visual.gate_proj": hv + iv,
        "visual.up_proj": hv + iv,
        "visual.down_proj": iv + hv,
    }
    bad = [t for t in targets if t not in lm and t not in vit and t != "lm_head"]
    if bad:
        accepted = LM_LINEARS + LINEAR_ATTENTION_LINEARS + VISION_LINEARS
        raise PlanError(f"train.lora.target_modules has {bad}; accepted: {', '.join(accepted)}")
    total = rank * spec.experts * (3 * h + 3 * spec.moe_intermediate) * spec.layers if experts else 0
    for t in targets:
        if t == "lm_head":
            total += rank * (h + spec.vocab)
        elif t in lm:
            total += rank * lm[t][0] * lm[t][1]
        else:
            total += rank * vit[t] * spec.vision_depth
    return total


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, num_seqs: int, seq_len: int, dtype_bytes: int) -> int:
    """K and V for every layer: 2·B·L·S·H_kv·D_h·bytes."""
    return 2 * num_seqs * layers * seq_len * kv_heads * head_dim * dtype_bytes
