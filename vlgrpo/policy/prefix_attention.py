"""The packed pass's attention on the CPU when a step's rows come in groups: each prompt's keys read once by all its
rows, as matrix products the size of the group.

The completions of one prompt (G rows of L tokens) attend to the same prompt keys and values [T, d] and each to its own
earlier tokens. PyTorch's CPU flash kernel runs that per row and head: products of L x d by d x T (31 x 48 by 48 x 355
in `benchmarks/bench_vs_trl.py`), at a seventh of what this CPU's matrix unit does on larger ones, and its backward
zero-fills and gathers a per-row copy of the prompt's keys. Here, per prompt and KV head, the G rows' queries and the
query heads that share that KV head are stacked into one [G x L x rep, d] matrix: the prompt part of the scores, the
output and all four backward products are one product each (the prompt's key and value gradients sum over the group
inside the product); the rows' own part is a small product per row. One softmax spans both parts, so the result is the
attention over [prompt | own tokens] with the causal mask on the own part and the prompt's padding masked.

It holds the softmax [B, kvh, G x L x rep, T + L] for the backward, where flash keeps one number per query: `fits`
bounds it, and larger passes (and GPUs, where the flash kernels are fast) keep SDPA.
"""

from __future__ import annotations

import torch
from torch import Tensor

HELD_BYTES = 64 * 2**20
"""The most the softmax held for the backward may take per layer (a tiny model's pass: 3 MB)."""


def fits(q: Tensor, prompt_keys: Tensor, groups: int) -> bool:
    """Whether `shared_prefix_attention` takes a packed pass of queries q [R, L, heads, d] over prompt keys [B, kvh,
    T, d], its rows in `groups` equal groups (0: not): fp32 on the CPU, the held softmax within HELD_BYTES."""
    if groups <= 0 or q.device.type != "cpu" or q.dtype != torch.float32:
        return False
    r, length, heads, _ = q.shape
    return r * length * heads * (prompt_keys.shape[2] + length) * 4 <= HELD_BYTES


def shared_prefix_attention(
    q: Tensor, prompt_k: Tensor, prompt_v: Tensor, k: Tensor, v: Tensor, prompt_bias: Tensor | None, scale: float
) -> Tensor:
    """q [R, L, heads, d] (R = B x G: prompt b's rows are b*G ... b*G + G-1), the prompts' keys and values [B, kvh,
    T, d], the rows' own keys and values [R, L, kvh, d], prompt_bias [B, T] additive (0, or -inf on padding; None:
    none) -> attention output [R, L, heads, d]."""
    return _SharedPrefix.apply(q * scale, prompt_k, prompt_v, k, v, prompt_bias)


def _grouped(x: Tensor, b: int, kvh: int) -> Tensor:
    """[R, L, heads or kvh, d] -> [B, kvh, G, L, rep, d] (a copy in that order; rep = 1 for keys and values)."""
    r, length, h, d = x.shape
    return x.view(b, r // b, length, kvh, h // kvh, d).permute(0, 3, 1, 2, 4, 5).contiguous()


def _rows(x: Tensor) -> Tensor:
    """The inverse of `_grouped`: [B, kvh, G, L, rep, d] -> [R, L, heads, d]."""
    b, kvh, g, length, rep, d = x.shape
    return x.permute(0, 2, 3, 1, 4, 5).reshape(b * g, length, kvh * rep, d)


class _SharedPrefix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, prompt_k, prompt_v, k, v, prompt_bias):
        b, kvh, t, d = prompt_k.shape
        r, length, heads, _ = q.shape
        g, rep = r // b, heads // kvh
        m = g * length * rep
        qg = _grouped(q, b, kvh)  # [B, kvh, G, L, rep, d]
        ko, vo = _grouped(k, b, kvh)[..., 0, :], _grouped(v, b, kvh)[..., 0, :]  # [B, kvh, G, L, d]
        own = qg.view(b, kvh, g, length * rep, d) @ ko.transpose(-1, -2)  # [B, kvh, G, L*rep, L]
        s = torch.cat((qg.view(b, kvh, m, d) @ prompt_k.transpose(-1, -2), own.view(b, kvh, m, length)), dim=-1)
        if prompt_bias is not None:
            s[..., :t] += prompt_bias[:, None, None, :]
        later = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1).repeat_interleave(rep, dim=0)
        s.view(b, kvh, g, length * rep, t + length)[..., t:].masked_fill_(later, float("-inf"))
        p = torch.softmax(s, dim=-1)  # [B, kvh, M, T + L]
        out = p[..., :t] @ prompt_v  # [B, kvh, M, d]
        own_p = p.view(b, kvh, g, length * rep, t + length)[..., t:]
        out.view(b, kvh, g, length * rep, d).add_(own_p @ vo)
        ctx.save_for_backward(qg, prompt_k, prompt_v, ko, vo, p, out)
        return _rows(out.view(b, kvh, g, length, rep, d))

    @staticmethod
    def backward(ctx, grad):
        qg, prompt_k, prompt_v, ko, vo, p, out = ctx.saved_tensors
        b, kvh, g, length, rep, d = qg.shape
        t, m = prompt_k.shape[2], g * length * rep
        do = _grouped(grad, b, kvh).view(b, kvh, m, d)
        delta = (do * out).sum(-1, keepdim=True)  # [B, kvh, M, 1]: rowsum(dO * O) = rowsum(dP * P)
        p_prompt = p[..., :t]
        p_own = p.view(b, kvh, g, length * rep, t + length)[..., t:]
        ds_prompt = (do @ prompt_v.transpose(-1, -2)).sub_(delta).mul_(p_prompt)  # [B, kvh, M, T]
        do_own = do.view(b, kvh, g, length * rep, d)
        ds_own = (do_own @ vo.transpose(-1, -2)).sub_(delta.view(b, kvh, g, length * rep, 1)).mul_(p_own)
        q2 = qg.view(b, kvh, m, d)
        dq = ds_prompt @ prompt_k
        dq.view(b, kvh, g, length * rep, d).add_(ds_own @ ko)
        d_prompt_k = ds_prompt.transpose(-1, -2) @ q2  # [B, kvh, T, d]: the group's rows and heads summed
        d_prompt_v = p_prompt.transpose(-1, -2) @ do
        dk = ds_own.transpose(-1, -2) @ qg.view(b, kvh, g, length * rep, d)  # [B, kvh, G, L, d]
        dv = p_own.transpose(-1, -2) @ do_own
        return (
            _rows(dq.view(b, kvh, g, length, rep, d)),
            d_prompt_k,
            d_prompt_v,
            _rows(dk[..., None, :]),
            _rows(dv[..., None, :]),
            None,
        )
