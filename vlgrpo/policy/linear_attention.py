"""Qwen3.5's Gated DeltaNet (linear attention) layers outside the transformers forward, one sequence per row.

A Gated DeltaNet layer carries two states from token to token instead of keys and values: the last
`linear_conv_kernel_dim` (4) inputs of its depthwise causal convolution ([conv dim, 4] per sequence) and a recurrent
state per value head ([k dim, v dim]). `gated_delta` runs the layer over rows [R, L] that each continue their own
states (the prompt's, from its prefill, repeated to the prompt's rows), so nothing crosses from one row to another:
the packing trap of hybrid models (a packed batch whose state flows from one sequence into the next) cannot happen.
Positions past a row's end are zeroed before the layer, as transformers masks padding, and come after every real
token, so they never reach a real one.

It calls the layer's own modules (projections, the convolution, the gated norm) and transformers' functions for the
delta rule and the convolution, looked up on the modeling module at each call, so the GPU kernels
(flash-linear-attention, causal-conv1d) are used where they are installed and PyTorch's fallbacks elsewhere.
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.activations import ACT2FN

CHUNK = 32
"""Tokens per chunk of the chunked delta rule (transformers' default 64). Its cost per chunk grows as the chunk's
square (a triangular solve and products of chunk x chunk matrices) and a row is padded to whole chunks: a packed pass
over completions of 31 tokens runs forward and backward in 12-17 ms a layer with 32 against 33-41 ms with 64
(16 rows, 4 heads of 48; dev/fast_path/README.md); a 355-token prefill costs the same either way. Equal results: the
rule is exact for any chunk size (0.0 and 2.4e-7 apart on those two)."""


def prompt_states(cache, layer_index: int) -> tuple[Tensor, Tensor]:
    """(conv state [B, conv dim, K], recurrent state [B, v heads, k dim, v dim]) a prefill left in the transformers
    cache for linear-attention layer `layer_index`."""
    layer = cache.layers[layer_index]
    return layer.conv_states[0], layer.recurrent_states[0]


def set_states(layer, conv: Tensor, state: Tensor) -> None:
    """Give a transformers linear-attention cache layer (empty) the states of sequences already run, conv [B, conv
    dim, K] and recurrent [B, v heads, k dim, v dim], so that a forward over it continues them as it continues a
    prefill's (its next tokens' convolution reads `conv` as their left context, the delta rule starts from `state`)."""
    layer.lazy_initialization(conv_states=conv, recurrent_states=state, conv_kernel_size=conv.shape[-1])
    layer.conv_states[0].copy_(conv)
    layer.recurrent_states[0].copy_(state)
    layer.has_previous_state[0] = True


def gated_delta(
    attn, h: Tensor, valid: Tensor | None, conv: Tensor, state: Tensor, final_state: bool = False
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One Gated DeltaNet layer (`attn`: the layer's `linear_attn`) over rows h [R, L, H] (normed hidden states)
    continuing states conv [R, C, K] and state [R, hv, dk, dv]; valid [R, L] bool marks real positions (None: all).
    -> (output [R, L, H], and with `final_state` the conv and recurrent states after the L tokens, else None, None;
    the final states are meant for rows without padding, the decode step's)."""
    modeling = sys.modules[type(attn).__module__]
    if valid is not None:
        h = h * valid[..., None].to(h.dtype)
    r, length, _ = h.shape
    mixed = attn.in_proj_qkv(h).transpose(1, 2)  # [R, C, L]
    z = attn.in_proj_z(h).reshape(r, length, -1, attn.head_v_dim)
    beta, a = attn.in_proj_b(h).sigmoid(), attn.in_proj_a(h)
    full = torch.cat((conv.to(mixed.dtype), mixed), dim=-1)  # [R, C, K + L]: the convolution's left context first
    new_conv = full[..., -attn.conv_kernel_size :] if final_state else None
    # the layer's own Conv1d (padding K - 1 on both sides): its first K + L outputs are causal, the last L are ours
    mixed = attn.conv1d(full)[..., : full.shape[-1]][..., -length:]
    mixed = ACT2FN[attn.activation](mixed)
    q, k, v = torch.split(mixed.transpose(1, 2), [attn.key_dim, attn.key_dim, attn.value_dim], dim=-1)
    q = q.reshape(r, length, -1, attn.head_k_dim)
    k = k.reshape(r, length, -1, attn.head_k_dim)
    v = v.reshape(r, length, -1, attn.head_v_dim)
    g = -attn.A_log.float().exp() * F.softplus(a.float() + attn.dt_bias)  # [R, L, hv]: log decay, <= 0
    if attn.num_v_heads // attn.num_k_heads > 1:
        q = q.repeat_interleave(attn.num_v_heads // attn.num_k_heads, dim=2)
        k = k.repeat_interleave(attn.num_v_heads // attn.num_k_heads, dim=2)
    if length == 1:
        rule = modeling.torch_recurrent_gated_delta_rule
    else:  # chunks of 32: the same numbers, and a packed pass's short rows no longer padded to 64 (CHUNK)
        rule = functools.partial(modeling.torch_chunk_gated_delta_rule, chunk_size=CHUNK)
    core, new_state = rule(
        q,
        k,
        v,
        g=g,
        beta=beta,
        initial_state=state,
        output_final_state=final_state,
        use_qk_l2norm_in_kernel=True,
    )
    core = attn.norm(core.reshape(-1, attn.head_v_dim), z.reshape(-1, attn.head_v_dim)).reshape(r, length, -1)
    return attn.out_proj(core), new_conv, new_state


def delta_step(attn, h: Tensor, conv: Tensor, state: Tensor, fused=None) -> tuple[Tensor, Tensor, Tensor]:
    """One token of each row through a Gated DeltaNet layer (`attn`: the layer's `linear_attn`), the decode step's:
    h [R, H] (normed hidden states), conv [R, C, K] and state [R, hv, dk, dv] (fp32) the rows' states -> (output
    [R, H], conv, state after the token). `gated_delta` with L = 1, in a third of its ops: the convolution's one
    output as a weighted sum of the window (transformers' Conv1d pads K - 1 on both sides to compute K + 1 outputs
    of which one is kept), the recurrent rule's one step without its sequence loop, transposes and copies, and with
    `fused` (`text_decoder.fuse` of in_proj_qkv, in_proj_z, in_proj_b and in_proj_a) the four input projections as one
    product. The same numbers up to the order of a few sums (tests/policy/test_linear_attention.py)."""
    r = h.shape[0]
    if fused is not None:
        mixed, z, b, a = fused(h)
    else:
        mixed, z, b, a = attn.in_proj_qkv(h), attn.in_proj_z(h), attn.in_proj_b(h), attn.in_proj_a(h)
    window = torch.cat((conv[..., 1:].to(mixed.dtype), mixed[..., None]), dim=-1)  # [R, C, K]: the new token last
    mixed = (window * attn.conv1d.weight[:, 0]).sum(-1)
    if attn.conv1d.bias is not None:
        mixed = mixed + attn.conv1d.bias
    mixed = ACT2FN[attn.activation](mixed)
    q, k, v = torch.split(mixed.float(), [attn.key_dim, attn.key_dim, attn.value_dim], dim=-1)
    q, k = q.view(r, -1, attn.head_k_dim), k.view(r, -1, attn.head_k_dim)
    if attn.num_v_heads // attn.num_k_heads > 1:
        q = q.repeat_interleave(attn.num_v_heads // attn.num_k_heads, dim=1)
        k = k.repeat_interleave(attn.num_v_heads // attn.num_k_heads, dim=1)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / attn.head_k_dim**0.5  # l2-normed, then scaled
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    g = -attn.A_log.float().exp() * F.softplus(a.float() + attn.dt_bias)  # [R, hv]: log decay, <= 0
    # the state [R, hv, dk, dv] read and written as products (k^T S, S += k delta^T, q^T S): one pass over it each,
    # where the elementwise form (transformers') makes two (a broadcast product, then its sum)
    state = state.float() * g.exp()[..., None, None]  # a new tensor: the caller's state is left as it was
    delta = (v.view(r, -1, attn.head_v_dim) - (k[..., None, :] @ state)[..., 0, :]) * b.float().sigmoid()[..., None]
    dk, dv = state.shape[-2:]
    state.view(-1, dk, dv).baddbmm_(k.reshape(-1, dk, 1), delta.reshape(-1, 1, dv))
    core = (q[..., None, :] @ state)[..., 0, :].to(h.dtype)  # [R, hv, dv]
    core = attn.norm(core.reshape(-1, attn.head_v_dim), z.reshape(-1, attn.head_v_dim)).reshape(r, -1)
    return attn.out_proj(core), window, state


def select_cache_rows(cache, index: Tensor) -> None:
    """Keep (and repeat) the cache's rows `index` [R'] in place, every layer's: keys and values, or a linear-attention
    layer's conv and recurrent states, which transformers' `batch_select_indices` and `batch_repeat_interleave` do
    not handle. For no-grad decoding only: transformers then updates those states in place."""
    for layer in cache.layers:
        if not hasattr(layer, "conv_states"):
            layer.batch_select_indices(index)
            continue
        for states in (layer.conv_states, layer.recurrent_states):
            for i, s in states.items():
                if s is not None:
                    states[i] = s[index.to(s.device)]
