"""The trainer's completion pass without padding: linear layers see only the completion tokens that exist.

A training batch holds R completions right-padded to the longest, C tokens. In the demo about half of the R x C
slots are padding (short answers beside 49-token box answers), and the transformers forward runs every projection,
MLP and the LM head on all of them. Here the tokens that predict a real next token are packed into one [N, H] matrix
for everything but attention; attention alone goes through the padded [R, L] layout (L = C - 1), where each row reads
its prompt's prefill keys and values (padding masked) and its own earlier tokens (causal). Qwen3.5's Gated DeltaNet
layers also run in that layout, each row continuing its own prompt's conv and recurrent states
(`linear_attention.gated_delta`): no state crosses from one packed row into the next. The KV heads are repeated
over their query heads, as transformers does for a masked SDPA on CUDA, whose GQA path falls back to the math kernel
when there is a mask. On the CPU, when the rows come in equal groups (a step's groups, whole), a prompt's rows
attend as one product per KV head against its keys instead (`prefix_attention.py`). The prompt's own pass is
`prefill.prefill`, once per prompt, with gradients flowing through its KV cache. The logits come back as [R, C, V]
in the layout the loss expects, zero on padding (masked there).

It calls the model's own modules, so LoRA wrappers and ZeRO-3's gathered weights work as in the transformers forward;
completion tokens are text, so their M-RoPE is the plain rotary embedding (`text_decoder.text_rotary`) and Qwen3-VL's
DeepStack (image tokens only) adds nothing; q/k norms as in `text_decoder.project_qkv`. Completions that hold images
(multi-turn rollouts: a tool response's crop) pass them as `CompletionImages`: the crop's embeddings replace its pads'
token embeddings, every token takes the model's own M-RoPE at its three position components (image tokens' differ,
and the text after a crop resumes past it), and DeepStack's maps are added at the crop's tokens after their layers,
as the transformers forward does. Models
that `text_decoder.supports_text_decoder` rejects, and gradient checkpointing, keep the transformers forward
(`forward.completion_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vlgrpo.families import is_gated_deltanet
from vlgrpo.policy.linear_attention import gated_delta, prompt_states
from vlgrpo.policy.prefix_attention import fits, shared_prefix_attention
from vlgrpo.policy.text_decoder import (
    feed_forward,
    first_attention,
    gated,
    project_qkv,
    rotate,
    signed_sin,
    text_rotary,
)


@dataclass
class CompletionImages:
    """The images inside R completions (tool responses' crops), for the packed pass."""

    positions: Tensor
    """[3, R, C] long: the M-RoPE positions of every completion token (`get_rope_index` over prompt + completion)."""
    embeds: Tensor
    """[M, H]: the images' merged embeddings, in the order of their pads (row by row, left to right)."""
    deepstack: list[Tensor] | None
    """Per DeepStack layer, [M, H] added at the pads after that decoder layer (Qwen3-VL); None without DeepStack."""
    image_id: int


def packed_completion_logits(
    model,
    completion_ids: Tensor,
    completion_mask: Tensor,
    row_prompt: Tensor,
    prompt_mask: Tensor,
    last: Tensor,
    cache,
    next_pos: Tensor,
    images: CompletionImages | None = None,
) -> Tensor:
    """completion_ids/mask [R, C] (right-padded), row_prompt [R], prompt_mask [B, Tp]; last [B, V], cache and
    next_pos [B] from `prefill.prefill`; `images`: the completions' own images, if any -> logits [R, C, V],
    logits[:, t] predicting completion token t."""
    text, head = model.get_decoder(), model.get_output_embeddings()
    r, c = completion_ids.shape
    first = last[row_prompt]  # [R, V]: the prompt's last position predicts completion token 0
    out = first.new_zeros(r, c, first.shape[-1])
    out[:, 0] = first
    inputs = completion_mask[:, 1:].bool()  # [R, L]: token t is an input iff token t + 1 exists
    rows, cols = inputs.nonzero(as_tuple=True)  # the packed order, row-major
    if rows.numel() == 0:
        return out
    length = int(cols.max()) + 1
    x = text.embed_tokens(completion_ids[rows, cols])  # [N, H]
    pads = None
    if images is None:
        cos, sin = text_rotary(text.rotary_emb, next_pos[row_prompt][rows] + cols, x.dtype)  # [N, 1, r]
    else:
        pads = completion_ids[rows, cols] == images.image_id  # [N]: every pad is an input (its image's end follows)
        if int(pads.sum()) != images.embeds.shape[0]:
            raise ValueError(
                f"the completions hold {int(pads.sum())} image pads as inputs, their images {images.embeds.shape[0]}"
            )
        x = x.masked_scatter(pads[:, None], images.embeds.to(x.dtype))
        cos, sin = text.rotary_emb(x[None], images.positions[:, rows, cols][:, None, :])  # [1, N, r]
        cos, sin = cos[0][:, None, :], signed_sin(sin[0][:, None, :])
    attn0 = first_attention(text)
    heads, kv_heads, d = text.config.num_attention_heads, text.config.num_key_value_heads, attn0.head_dim
    prompt_ok = prompt_mask.bool()[row_prompt][:, None, None, :].expand(r, 1, length, prompt_mask.shape[1])
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
    allowed = torch.cat((prompt_ok, causal.expand(r, 1, length, length)), dim=-1)  # [R, 1, L, Tp + L]
    valid = inputs[:, :length]  # [R, L]
    dense = rows.numel() == r * length  # every row has L inputs: packed and padded are the same layout
    # query head j reads KV head j // rep: the CPU's flash kernel takes grouped heads with a mask (the same result, a
    # quarter less time forward and back than repeated heads); CUDA's takes them with a mask only in its math kernel
    # ([L, Tp + L] scores per head), so there the heads are repeated
    grouped = heads != kv_heads and x.device.type == "cpu"
    # each prompt's rows side by side, as many for each (a step's groups, whole): its keys and values broadcast to
    # them inside the one concatenation, not gathered per row first (a copy forward, an index_put back)
    b = prompt_mask.shape[0]
    g = r // b if r % b == 0 else 0
    side_by_side = g > 0 and torch.equal(row_prompt, torch.arange(b, device=row_prompt.device).repeat_interleave(g))

    def with_prompt(prompt: Tensor, own: Tensor) -> Tensor:  # [B, kvh, Tp, d], [R, L, kvh, d] -> [R, kvh, Tp + L, d]
        own = own.transpose(1, 2)
        if not side_by_side:
            return torch.cat((prompt[row_prompt], own), dim=2)
        both = torch.cat((prompt[:, None].expand(b, g, *prompt.shape[1:]), own.view(b, g, *own.shape[1:])), dim=3)
        return both.view(r, *both.shape[2:])

    def padded(t: Tensor) -> Tensor:  # [N, ...] -> [R, L, ...], zeros on padding
        if dense:
            return t.view(r, length, *t.shape[1:])
        return t.new_zeros(r, length, *t.shape[1:]).index_put((rows, cols), t)

    def packed(t: Tensor) -> Tensor:  # [R, L, ...] -> [N, ...], the inverse of `padded`
        return t.reshape(r * length, *t.shape[2:]) if dense else t[rows, cols]

    prompt_bias = None  # [B, Tp] additive: -inf on the prompts' left padding
    if not bool(prompt_mask.all()):
        prompt_bias = torch.zeros(prompt_mask.shape, dtype=x.dtype, device=x.device)
        prompt_bias.masked_fill_(prompt_mask == 0, float("-inf"))

    def attention(attn, h: Tensor, kv) -> Tensor:  # [N, H] -> [N, H]: the rows read their prompt's keys and values
        q, k, v, gate = project_qkv(attn, h, heads, kv_heads, d)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k, v = padded(q), padded(k), padded(v)  # [R, L, heads or kvh, d]
        if fits(q, kv.keys, g if side_by_side else 0):  # the CPU, groups: a prompt's rows as one product
            o = shared_prefix_attention(q, kv.keys, kv.values, k, v, prompt_bias, attn.scaling)
            return attn.o_proj(gated(packed(o).reshape(-1, heads * d), gate))
        keys, values = with_prompt(kv.keys, k), with_prompt(kv.values, v)  # [R, kvh, Tp + L, d]
        if heads != kv_heads and not grouped:
            keys = keys.repeat_interleave(heads // kv_heads, dim=1)
            values = values.repeat_interleave(heads // kv_heads, dim=1)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=allowed, scale=attn.scaling, enable_gqa=grouped
        )
        return attn.o_proj(gated(packed(o.transpose(1, 2)).reshape(-1, heads * d), gate))

    for li, layer in enumerate(text.layers):
        h = layer.input_layernorm(x)
        if is_gated_deltanet(layer):  # Gated DeltaNet: each row continues its own prompt's states
            conv, state = prompt_states(cache, li)
            o, _, _ = gated_delta(layer.linear_attn, padded(h), valid, conv[row_prompt], state[row_prompt])
            x = x + packed(o)
        else:
            x = x + attention(layer.self_attn, h, cache.layers[li])
        x = x + feed_forward(layer, layer.post_attention_layernorm(x))
        if pads is not None and images.deepstack is not None and li < len(images.deepstack):
            x = x.masked_scatter(pads[:, None], x[pads] + images.deepstack[li].to(x.dtype))
    out[rows, cols + 1] = head(text.norm(x)).to(out.dtype)  # in place: one [R, C, V] tensor, not two
    return out
