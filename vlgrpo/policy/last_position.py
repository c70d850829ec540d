"""A prompt pass that keeps only the last position's logits and the KV cache (a prefill: the rollout's, the update's,
a continued turn's) runs its last decoder layer in full for the keys and values only.

Each layer's keys and values come from its input, so the last layer's queries, attention output and MLP reach nothing
but the final hidden states, of which the LM head reads one position per prompt. Inside `last_position_only(model)`
the last layer computes its keys and values over every position (into the cache, as its attention would), then its
query, attention, output projection and MLP at the last position only, and hands the final norm a [B, 1, H] hidden
state; the logits (`logits_to_keep=1`) and every layer's cache are those of the full layer. That is the layer's share
of the pass less its key and value projections: 1/8 of a tiny model's prompt pass, forward and backward (the update
takes a kept prefill's gradients through it, `policy.kept_prefill`), 1/28 of a 7B's.

It applies where the last layer is a plain attention layer of the models `text_decoder` runs, with SDPA or eager
attention: not to a Gated DeltaNet layer (its state is the whole sequence's), a mixture-of-experts layer (a rollout
records every prompt token's experts there), a DeepStack layer (its visual maps are added at the image tokens' hidden
states), a layer whose forward is already replaced or whose weights ZeRO-3 partitions; there the layer runs whole.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch.nn.functional as F
from torch import Tensor

from vlgrpo.families import is_gated_deltanet
from vlgrpo.policy.text_decoder import (
    feed_forward,
    gated,
    is_moe_block,
    project_kv,
    project_q,
    rotate,
    signed_sin,
    supports_text_decoder,
)


def trimmable_layer(model):
    """The decoder layer `last_position_only` runs at the last position, or None where it runs whole (see above)."""
    if not supports_text_decoder(model):
        return None
    text = model.get_decoder()
    layer = text.layers[-1]
    deepstack = getattr(getattr(model.config, "vision_config", None), "deepstack_visual_indexes", None) or ()
    if (
        is_gated_deltanet(layer)
        or not hasattr(layer, "self_attn")
        or is_moe_block(layer.mlp)
        or len(deepstack) >= len(text.layers)
        or "forward" in layer.__dict__
        or getattr(text.config, "_attn_implementation", None) not in ("sdpa", "eager")
        or any(hasattr(p, "ds_id") for p in layer.parameters())
    ):
        return None
    return layer


@contextmanager
def last_position_only(model) -> Iterator[None]:
    """Within: a forward of `model` computes its last layer's keys and values at every position and the rest of that
    layer at the last position only (the caller keeps the last position's logits and the cache)."""
    layer = trimmable_layer(model)
    if layer is None:
        yield
        return
    layer.forward = functools.partial(_last_position, layer)
    try:
        yield
    finally:
        del layer.forward


def _last_position(
    layer,
    hidden_states: Tensor,
    attention_mask: Tensor | None = None,
    position_ids=None,
    past_key_values=None,
    use_cache: bool = False,
    position_embeddings: tuple[Tensor, Tensor] | None = None,
    **kwargs,
) -> Tensor:
    """The decoder layer's forward (transformers' signature) -> its output at the last position [B, 1, H]."""
    attn = layer.self_attn
    cfg = attn.config
    heads, kv_heads, d = cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim
    b, t, width = hidden_states.shape
    h = layer.input_layernorm(hidden_states)
    cos, sin = position_embeddings  # [B, T, r]: the M-RoPE the text model computed for these positions
    sin = signed_sin(sin)
    k, v = project_kv(attn, h.reshape(b * t, width), kv_heads, d)
    k = rotate(k.view(b, t, kv_heads, d), cos[:, :, None], sin[:, :, None]).transpose(1, 2)  # [B, kvh, T, d]
    v = v.view(b, t, kv_heads, d).transpose(1, 2)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, attn.layer_idx)  # [B, kvh, S, d]: the cache's earlier positions too
    q, gate = project_q(attn, h[:, -1], heads, d)  # [B, heads, d]
    q = rotate(q, cos[:, -1:], sin[:, -1:])
    mask = attention_mask
    if mask is not None:  # the last query's row of the layer's mask: [B, 1, 1, S]
        mask = mask[:, :, -1:, : k.shape[2]] if mask.dim() == 4 else mask[:, None, None, : k.shape[2]].bool()
    o = F.scaled_dot_product_attention(
        q[:, :, None], k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=heads != kv_heads
    )  # [B, heads, 1, d]
    x = hidden_states[:, -1] + attn.o_proj(gated(o.reshape(b, heads * d), gate))
    x = x + feed_forward(layer, layer.post_attention_layernorm(x))
    return x[:, None]
