"""The policy's text decoder layer by layer, outside the transformers forward: which models it runs, the rotary
embedding of text tokens and the attention's projections. Shared by the HF engine's shared-prefix decode step
(`rollout/decode.py`) and the trainer's packed completion pass (`packed.py`).

Text tokens' three M-RoPE position components are equal, which makes M-RoPE the plain rotary embedding at that position
(Qwen2-VL, Qwen2.5-VL, Qwen3-VL's and Qwen3.5's interleaved sections alike). Qwen3's RMSNorm on each head's queries and
keys runs before the rotation, as in its attention. Qwen3.5's full-attention layers rotate the first quarter of each
head only (`partial_rotary_factor`) and gate their output (`q_proj` emits each head's query and gate side by side:
output * sigmoid(gate)); its Gated DeltaNet layers are `linear_attention.py`'s.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vlgrpo.families import is_gated_deltanet


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def text_rotary(rot, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin [n, 1, r] of text tokens at `positions` [n] (their three M-RoPE components equal: plain rotary); r is
    the rotated part of a head (the whole head, or Qwen3.5's first quarter)."""
    freqs = positions[:, None].float() * rot.inv_freq.to(device=positions.device, dtype=torch.float)  # [n, r/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (
        (emb.cos() * rot.attention_scaling).to(dtype)[:, None, :],
        (emb.sin() * rot.attention_scaling).to(dtype)[:, None, :],
    )


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of queries or keys x [..., d]; with cos/sin narrower than d (partial rotary) only the first
    cos.shape[-1] dims turn, the rest pass unchanged."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    turned, rest = x[..., :r], x[..., r:]
    return torch.cat((turned * cos + rotate_half(turned) * sin, rest), dim=-1)


def attention_layers(text) -> list[int]:
    """Indices of the decoder layers with (full) attention; the others are linear attention (Qwen3.5)."""
    return [i for i, layer in enumerate(text.layers) if not is_gated_deltanet(layer)]


def first_attention(text):
    """The first full-attention module: its head size and scaling are every attention layer's."""
    return text.layers[attention_layers(text)[0]].self_attn


def is_hybrid(model) -> bool:
    """A text decoder with linear-attention layers beside attention (Qwen3.5): its per-sequence state lives in the
    cache's conv and recurrent states, which transformers' cache cannot repeat or select per row."""
    try:
        return any(is_gated_deltanet(layer) for layer in model.get_decoder().layers)
    except (AttributeError, TypeError):
        return False


def supports_text_decoder(model) -> bool:
    """A Qwen2-, Qwen3- or Qwen3.5-style text decoder (rotary, grouped-query attention, q/k norms or none, gated or
    not, Gated DeltaNet layers or none, no sliding window) that the shared-prefix decode step and the packed
    completion pass (`packed.py`) can run."""
    try:
        text = model.get_decoder()
        attn = first_attention(text)
        return (
            hasattr(text.rotary_emb, "inv_freq")
            and hasattr(attn, "q_proj")
            and hasattr(attn, "head_dim")
            and hasattr(attn, "q_norm") == hasattr(attn, "k_norm")
            and not getattr(text.config, "use_sliding_window", False)
        )
    except (AttributeError, IndexError, TypeError):
        return False


def project_qkv(attn, h: Tensor, heads: int, kv_heads: int, d: int) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Queries [n, heads, d], keys and values [n, kv heads, d] of hidden states h [n, H], before the rotation, and
    the output gate [n, heads * d] of a gated attention (Qwen3.5), else None; a Qwen3 attention normalises each query
    and key head (`q_norm`, `k_norm`: RMSNorm over d)."""
    q, gate = attn.q_proj(h), None
    if q.shape[-1] == 2 * heads * d:  # Qwen3.5: each head's query, then its gate
        q, gate = q.view(-1, heads, 2 * d).chunk(2, dim=-1)
        gate = gate.reshape(-1, heads * d)
    q = q.reshape(-1, heads, d)
    k = attn.k_proj(h).view(-1, kv_heads, d)
    v = attn.v_proj(h).view(-1, kv_heads, d)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q, k, v, gate


def feed_forward(layer, h: Tensor) -> Tensor:
    """A decoder layer's MLP on hidden states h [n, H] -> [n, H]: a dense MLP, or a mixture-of-experts block (its
    router's top-k experts per token; Qwen3.5-MoE adds a gated shared expert), which takes [batch, seq, H]."""
    if is_moe_block(layer.mlp):
        return layer.mlp(h[None])[0]
    return layer.mlp(h)


def is_moe_block(mlp) -> bool:
    """A mixture-of-experts feed-forward block (a router `gate` choosing among `experts`), not a dense MLP."""
    return hasattr(mlp, "experts") and hasattr(mlp, "gate")


def gated(out: Tensor, gate: Tensor | None) -> Tensor:
    """A gated attention's output (Qwen3.5: out * sigmoid(gate)), or the output unchanged."""
    return out if gate is None else out * torch.sigmoid(gate)
