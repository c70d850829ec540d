"""The trainer's completion pass without padding: linear layers see only the completion tokens that exist.

A training batch holds R completions right-padded to the longest, C tokens. In the demo about half of the R x C
slots are padding (short answers beside 49-token box answers), and the transformers forward runs every projection,
MLP and the LM head on all of them. Here the tokens that predict a real next token are packed into one [N, H] matrix
for everything but attention; attention alone goes through the padded [R, L] layout (L = C - 1), where each row reads
its prompt's prefill keys and values (padding masked) and its own earlier tokens (causal). The KV heads are repeated
over their query heads, as transformers does for a masked SDPA on CUDA, whose GQA path falls back to the math kernel
when there is a mask. The prompt's own pass is `forward.prefill`, once per prompt, with gradients flowing through its
KV cache. The logits come back as [R, C, V] in the layout the loss expects, zero on padding (masked there).

It calls the model's own modules, so LoRA wrappers and ZeRO-3's gathered weights work as in the transformers forward;
completion tokens are text, so their M-RoPE is the plain rotary embedding (`text_decoder.text_rotary`) and Qwen3-VL's
DeepStack (image tokens only) adds nothing; q/k norms as in `text_decoder.project_qkv`. Models
that `text_decoder.supports_text_decoder` rejects, and gradient checkpointing, keep the transformers forward
(`forward.completion_logits`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vlgrpo.policy.text_decoder import project_qkv, rotate_half, text_rotary


def packed_completion_logits(
    model,
    completion_ids: Tensor,
    completion_mask: Tensor,
    row_prompt: Tensor,
    prompt_mask: Tensor,
    last: Tensor,
    cache,
    next_pos: Tensor,
) -> Tensor:
    """completion_ids/mask [R, C] (right-padded), row_prompt [R], prompt_mask [B, Tp]; last [B, V], cache and
    next_pos [B] from `forward.prefill` -> logits [R, C, V], logits[:, t] predicting completion token t."""
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
    cos, sin = text_rotary(text.rotary_emb, next_pos[row_prompt][rows] + cols, x.dtype)  # [N, 1, d]
    attn0 = text.layers[0].self_attn
    heads, kv_heads, d = text.config.num_attention_heads, text.config.num_key_value_heads, attn0.head_dim
    prompt_ok = prompt_mask.bool()[row_prompt][:, None, None, :].expand(r, 1, length, prompt_mask.shape[1])
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
    allowed = torch.cat((prompt_ok, causal.expand(r, 1, length, length)), dim=-1)  # [R, 1, L, Tp + L]

    def padded(t: Tensor) -> Tensor:  # [N, h, d] -> [R, h, L, d], zeros on padding
        return t.new_zeros(r, length, *t.shape[1:]).index_put((rows, cols), t).transpose(1, 2)

    for li, layer in enumerate(text.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = project_qkv(attn, h, heads, kv_heads, d)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        keys = torch.cat((cache.layers[li].keys[row_prompt], padded(k)), dim=2)  # [R, kvh, Tp + L, d]
        values = torch.cat((cache.layers[li].values[row_prompt], padded(v)), dim=2)
        if heads != kv_heads:  # query head j reads KV head j // rep; CUDA's SDPA takes a mask with GQA only in
            keys = keys.repeat_interleave(heads // kv_heads, dim=1)  # its math kernel ([L, Tp + L] scores per
            values = values.repeat_interleave(heads // kv_heads, dim=1)  # head), so the heads are repeated
        o = F.scaled_dot_product_attention(padded(q), keys, values, attn_mask=allowed, scale=attn.scaling)
        x = x + attn.o_proj(o.transpose(1, 2)[rows, cols].reshape(-1, heads * d))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    out[rows, cols + 1] = head(text.norm(x)).to(out.dtype)  # in place: one [R, C, V] tensor, not two
    return out
