"""The policy's text decoder layer by layer, outside the transformers forward: which models it runs, the rotary
embedding of text tokens and the q/k/v projections. Shared by the HF engine's shared-prefix decode step
(`rollout/decode.py`) and the trainer's packed completion pass (`packed.py`).

Text tokens' three M-RoPE position components are equal, which makes M-RoPE the plain rotary embedding at that position
(Qwen2-VL, Qwen2.5-VL and Qwen3-VL's interleaved sections alike). Qwen3's RMSNorm on each head's queries and keys
runs before the rotation, as in its attention.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def text_rotary(rot, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin [n, 1, d] of text tokens at `positions` [n] (their three M-RoPE components equal: plain rotary)."""
    freqs = positions[:, None].float() * rot.inv_freq.to(device=positions.device, dtype=torch.float)  # [n, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (
        (emb.cos() * rot.attention_scaling).to(dtype)[:, None, :],
        (emb.sin() * rot.attention_scaling).to(dtype)[:, None, :],
    )


def supports_text_decoder(model) -> bool:
    """A Qwen2- or Qwen3-style text decoder (rotary, grouped-query attention, q/k norms or none, no sliding window)
    that the shared-prefix decode step and the packed completion pass (`packed.py`) can run."""
    try:
        text = model.get_decoder()
        attn = text.layers[0].self_attn
        return (
            hasattr(text.rotary_emb, "inv_freq")
            and hasattr(attn, "q_proj")
            and hasattr(attn, "head_dim")
            and hasattr(attn, "q_norm") == hasattr(attn, "k_norm")
            and not getattr(text.config, "use_sliding_window", False)
        )
    except (AttributeError, IndexError, TypeError):
        return False


def project_qkv(attn, h: Tensor, heads: int, kv_heads: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    """Queries [n, heads, d], keys and values [n, kv heads, d] of hidden states h [n, H], before the rotation; a
    Qwen3 attention normalises each query and key head (`q_norm`, `k_norm`: RMSNorm over d)."""
    q = attn.q_proj(h).view(-1, heads, d)
    k = attn.k_proj(h).view(-1, kv_heads, d)
    v = attn.v_proj(h).view(-1, kv_heads, d)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q, k, v
