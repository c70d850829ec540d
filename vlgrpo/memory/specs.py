"""Model specs for the memory planner: architecture numbers and parameter counts of Qwen2-VL / Qwen2.5-VL / Qwen3-VL /
Qwen3.5, from a built-in table of the released checkpoints or a local HF `config.json`. The counts come from the
architecture formulas (checked against transformers in the tests), which branch on each family's traits in
`vlgrpo.families`. Pure arithmetic: no torch, no weights.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlgrpo.families import FAMILIES, GATED_DELTANET, Family, is_gated_deltanet
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


def _qwen2_5(name, hidden, inter, layers, heads, kv, vocab, tie, vis_inter=3420) -> ModelSpec:
    return ModelSpec(
        name, "qwen2_5_vl", hidden, inter, layers, heads, kv, hidden // heads, vocab, tie, vision_intermediate=vis_inter
    )


def _qwen2(name, hidden, inter, layers, heads, kv, vocab, tie) -> ModelSpec:
    return ModelSpec(
        name, "qwen2_vl", hidden, inter, layers, heads, kv, hidden // heads, vocab, tie, vision_intermediate=4 * 1280
    )  # mlp_ratio 4 x embed_dim 1280


def _qwen3(name, hidden, inter, layers, heads, kv, tie, vision, deepstack) -> ModelSpec:
    """A dense Qwen3-VL: head_dim 128 and vocabulary 151,936 in every size; 16 px patches and 2,304 learned positions in
    the tower (its pixel bounds: `vlgrpo.families`). `vision` is (depth, hidden, intermediate)."""
    depth, hv, iv = vision
    return ModelSpec(
        name,
        "qwen3_vl",
        hidden,
        inter,
        layers,
        heads,
        kv,
        128,
        151936,
        tie,
        vision_depth=depth,
        vision_hidden=hv,
        vision_intermediate=iv,
        patch=16,
        position_embeddings=2304,
        deepstack_mergers=len(deepstack),
    )


def _qwen3_5(name, hidden, inter, layers, heads, kv, linear_v_heads, tie, vision) -> ModelSpec:
    """A dense Qwen3.5: head_dim 256 (a quarter rotated), vocabulary 248,320, Gated DeltaNet in 3 of every 4 layers
    with 16 key heads of 128 and `linear_v_heads` value heads of 128, conv kernel 4; Qwen3-VL's tower (16 px, 2,304
    learned positions) without DeepStack. `vision` is (depth, hidden, intermediate)."""
    depth, hv, iv = vision
    return ModelSpec(
        name,
        "qwen3_5",
        hidden,
        inter,
        layers,
        heads,
        kv,
        256,
        248320,
        tie,
        vision_depth=depth,
        vision_hidden=hv,
        vision_intermediate=iv,
        patch=16,
        position_embeddings=2304,
        linear_layers=layers * 3 // 4,
        linear_k_heads=16,
        linear_v_heads=linear_v_heads,
        linear_k_dim=128,
        linear_v_dim=128,
    )


def _moe(dense: ModelSpec, experts: int, top_k: int, width: int, shared: int = 0) -> ModelSpec:
    """A mixture-of-experts sibling of a dense spec: every layer's MLP is `experts` routed experts of `width` (top-k per
    token), with a gated shared expert of `shared` (Qwen3.5-MoE)."""
    family = next(a for a, f in FAMILIES.items() if f.dense == dense.family)
    return dataclasses.replace(
        dense,
        family=family,
        experts=experts,
        experts_per_token=top_k,
        moe_intermediate=width,
        shared_expert_intermediate=shared,
    )


# Public config.json values of the released checkpoints. Qwen3-VL (docs/memory.md names the sources): transformers'
# Qwen3VLConfig defaults are none of them (its text defaults are 32 layers x 4096 with intermediate 22016).
MODEL_TABLE: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        _qwen2("Qwen/Qwen2-VL-2B-Instruct", 1536, 8960, 28, 12, 2, 151936, True),
        _qwen2("Qwen/Qwen2-VL-7B-Instruct", 3584, 18944, 28, 28, 4, 152064, False),
        _qwen2_5("Qwen/Qwen2.5-VL-3B-Instruct", 2048, 11008, 36, 16, 2, 151936, True),
        _qwen2_5("Qwen/Qwen2.5-VL-7B-Instruct", 3584, 18944, 28, 28, 4, 152064, False),
        _qwen2_5("Qwen/Qwen2.5-VL-32B-Instruct", 5120, 27648, 64, 40, 8, 152064, False, vis_inter=3456),
        _qwen2_5("Qwen/Qwen2.5-VL-72B-Instruct", 8192, 29568, 80, 64, 8, 152064, False, vis_inter=3456),
        _qwen3("Qwen/Qwen3-VL-2B-Instruct", 2048, 6144, 28, 16, 8, True, (24, 1024, 4096), (5, 11, 17)),
        _qwen3("Qwen/Qwen3-VL-4B-Instruct", 2560, 9728, 36, 32, 8, True, (24, 1024, 4096), (5, 11, 17)),
        _qwen3("Qwen/Qwen3-VL-8B-Instruct", 4096, 12288, 36, 32, 8, False, (27, 1152, 4304), (8, 16, 24)),
        _qwen3("Qwen/Qwen3-VL-32B-Instruct", 5120, 25600, 64, 64, 8, False, (27, 1152, 4304), (8, 16, 24)),
        _qwen3_5("Qwen/Qwen3.5-0.8B", 1024, 3584, 24, 8, 2, 16, True, (12, 768, 3072)),
        _qwen3_5("Qwen/Qwen3.5-2B", 2048, 6144, 24, 8, 2, 16, True, (24, 1024, 4096)),
        _qwen3_5("Qwen/Qwen3.5-4B", 2560, 9216, 32, 16, 4, 32, True, (24, 1024, 4096)),
        _qwen3_5("Qwen/Qwen3.5-9B", 4096, 12288, 32, 16, 4, 32, False, (27, 1152, 4304)),
        _qwen3_5("Qwen/Qwen3.5-27B", 5120, 17408, 64, 24, 4, 48, False, (27, 1152, 4304)),
        _moe(
            _qwen3("Qwen/Qwen3-VL-30B-A3B-Instruct", 2048, 6144, 48, 32, 4, False, (27, 1152, 4304), (8, 16, 24)),
            experts=128,
            top_k=8,
            width=768,
        ),
        _moe(
            _qwen3_5("Qwen/Qwen3.5-35B-A3B", 2048, 0, 40, 16, 2, 32, False, (27, 1152, 4304)),
            experts=256,
            top_k=8,
            width=512,
            shared=512,
        ),
    )
}


def _short(name: str) -> str:
    n = name.lower().strip().removeprefix("qwen/")
    return n.removesuffix("-instruct")


def spec_from_config_json(path: str | Path) -> ModelSpec:
    """Read a Qwen2-VL / Qwen2.5-VL / Qwen3-VL HF config.json (text keys under `text_config` or at the top level)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PlanError(f"cannot read model config '{path}': {e}") from None
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise PlanError(f"'{path}': model_type {family!r} is not supported; accepted: {', '.join(FAMILIES)}")
    text, vis = {**raw, **(raw.get("text_config") or {})}, raw.get("vision_config") or {}

    def need(d: dict, key: str, where: str) -> Any:
        if key not in d:
            raise PlanError(f"'{path}' has no {where}{key}; the planner needs it to count parameters")
        return d[key]

    heads = need(text, "num_attention_heads", "")
    hidden = need(text, "hidden_size", "")
    if family == "qwen2_vl":
        hv = need(vis, "embed_dim", "vision_config.")
        iv = int(hv * vis.get("mlp_ratio", 4))
    else:
        hv, iv = need(vis, "hidden_size", "vision_config."), need(vis, "intermediate_size", "vision_config.")
    traits = FAMILIES[family]
    moe = {}
    if traits.dense is not None:  # routed experts in every layer (Qwen3.5-MoE: beside a gated shared expert)
        moe = dict(
            experts=need(text, "num_experts", ""),
            experts_per_token=need(text, "num_experts_per_tok", ""),
            moe_intermediate=need(text, "moe_intermediate_size", ""),
            shared_expert_intermediate=text.get("shared_expert_intermediate_size", 0) if traits.hybrid_attention else 0,
        )
    # transformers ties Qwen3-VL's and Qwen3.5's lm_head by the top-level key only (the released files set both alike)
    tie = raw.get("tie_word_embeddings", False) if traits.qwen3 else text.get("tie_word_embeddings", False)
    return ModelSpec(
        name=str(path.parent),
        family=family,
        hidden=hidden,
        intermediate=text.get("intermediate_size", 0) if moe else need(text, "intermediate_size", ""),
        layers=need(text, "num_hidden_layers", ""),
        heads=heads,
        kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or (128 if traits.qwen3 else hidden // heads),
        vocab=need(text, "vocab_size", ""),
        tie_embeddings=bool(tie),
        vision_depth=need(vis, "depth", "vision_config."),
        vision_hidden=hv,
        vision_intermediate=iv,
        patch=vis.get("patch_size", traits.patch_size),
        merge=vis.get("spatial_merge_size", 2),
        temporal_patch=vis.get("temporal_patch_size", 2),
        in_channels=vis.get("in_channels", vis.get("in_chans", 3)),
        position_embeddings=vis.get("num_position_embeddings", 2304) if traits.qwen3 else 0,
        deepstack_mergers=len(vis.get("deepstack_visual_indexes", (8, 16, 24))) if traits.deepstack else 0,
        **(_linear_attention(text) if traits.hybrid_attention else {}),
        **moe,
    )


def _linear_attention(text: dict) -> dict:
    """Qwen3.5's Gated DeltaNet numbers from its text config (transformers' defaults where a key is absent)."""
    layers = text["num_hidden_layers"]
    interval = text.get("full_attention_interval", 4)
    types = text.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else GATED_DELTANET for i in range(layers)
    ]
    return dict(
        linear_layers=sum(map(is_gated_deltanet, types)),
        linear_k_heads=text.get("linear_num_key_heads", 16),
        linear_v_heads=text.get("linear_num_value_heads", 32),
        linear_k_dim=text.get("linear_key_head_dim", 128),
        linear_v_dim=text.get("linear_value_head_dim", 128),
        conv_kernel=text.get("linear_conv_kernel_dim", 4),
    )


def resolve_model(name_or_path: str) -> ModelSpec:
    """A directory with config.json (or the file), else a table name like `qwen2.5-vl-7b` or `qwen3-vl-8b` (any case,
    -Instruct optional)."""
    p = Path(name_or_path)
    if p.is_dir() and (p / "config.json").is_file():
        return spec_from_config_json(p / "config.json")
    if p.is_file() and p.name.endswith(".json"):
        return spec_from_config_json(p)
    by_short = {_short(k): v for k, v in MODEL_TABLE.items()}
    if _short(name_or_path) in by_short:
        return by_short[_short(name_or_path)]
    raise PlanError(
        f"model '{name_or_path}' is neither a directory holding config.json nor a known model; known: "
        f"{', '.join(MODEL_TABLE)} (short forms like qwen2.5-vl-7b work too), or plan with --params N"
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
