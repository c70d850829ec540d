"""Per-token log-probs and entropies from `[N, T, V]` logits without materialising an fp32 `[N, T, V]` log-softmax.

Chunks of at most `chunk_tokens` positions are upcast to fp32 one at a time; the backward pass recomputes each chunk
from the saved logits, so the extra memory is O(chunk_tokens * V) in both passes. Knows nothing of models.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _blocks(n: int, t: int, chunk_tokens: int):
    """(row slice, column slice) blocks of an [n, t] grid with at most chunk_tokens cells each (views, no reshape)."""
    if t == 0:
        return
    if t >= chunk_tokens:
        for i in range(n):
            for j in range(0, t, chunk_tokens):
                yield slice(i, i + 1), slice(j, j + chunk_tokens)
    else:
        rows = chunk_tokens // t
        for i in range(0, n, rows):
            yield slice(i, i + rows), slice(None)


def _log_softmax_chunk(logits: Tensor, temperature: float, forbidden: Tensor | None, lse: Tensor | None = None):
    """log softmax(logits / temperature) of one chunk, forbidden ids at -inf, in a fresh >= fp32 buffer (ours to
    edit in place), and its logsumexp (computed unless given). [n, t, V] -> ([n, t, V], [n, t])."""
    x = torch.empty(logits.shape, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    x.copy_(logits)
    if temperature != 1.0:
        x.div_(temperature)
    if forbidden is not None:
        x.masked_fill_(forbidden, -torch.inf)
    z = torch.logsumexp(x, dim=-1) if lse is None else lse
    return x.sub_(z.unsqueeze(-1)), z


def _forward(logits, ids, temperature, forbidden, chunk_tokens):
    """-> logp, entropy, logsumexp, each [N, T] in fp32 (fp64 for fp64 logits); no autograd, two chunk buffers."""
    n, t, _ = logits.shape
    logp = torch.empty(n, t, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    ent, lse = torch.empty_like(logp), torch.empty_like(logp)
    for r, c in _blocks(n, t, chunk_tokens):
        log_p, lse[r, c] = _log_softmax_chunk(logits[r, c], temperature, forbidden)  # [n', t', V]
        logp[r, c] = log_p.gather(-1, ids[r, c].unsqueeze(-1)).squeeze(-1)
        p = log_p.exp()
        if forbidden is not None:
            log_p.masked_fill_(forbidden, 0.0)  # p = 0 there; 0 * -inf would be NaN
        # H = -sum_v p_v log p_v (= logsumexp - sum_v p_v x_v, but without the cancellation of two large numbers)
        ent[r, c] = -p.mul_(log_p).sum(-1)
    return logp, ent, lse


class _ChunkedLogProbs(torch.autograd.Function):
    """Autograd wrapper: saves only the logits (already alive in the graph) and [N, T] stats; recomputes chunks."""

    @staticmethod
    def forward(ctx, logits, ids, temperature, forbidden, chunk_tokens):
        logp, ent, lse = _forward(logits, ids, temperature, forbidden, chunk_tokens)
        ctx.save_for_backward(logits, ids, lse, ent)
        ctx.temperature, ctx.forbidden, ctx.chunk_tokens = temperature, forbidden, chunk_tokens
        return logp, ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_logp, g_ent):
        logits, ids, lse, ent = ctx.saved_tensors
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.to(lse.dtype)
        g_ent = torch.zeros_like(lse) if g_ent is None else g_ent.to(lse.dtype)
        grad = torch.empty_like(logits)
        n, t, _ = logits.shape
        for r, c in _blocks(n, t, ctx.chunk_tokens):
            log_p, _ = _log_softmax_chunk(logits[r, c], ctx.temperature, ctx.forbidden, lse[r, c])
            p = log_p.exp()
            if ctx.forbidden is not None:
                log_p.masked_fill_(ctx.forbidden, 0.0)  # p = 0 there; avoid 0 * -inf
            # d logp_y / dx = onehot(y) - p ;  dH / dx = -p (log p + H) ;  x = logits / temperature
            gl, ge = g_logp[r, c].unsqueeze(-1), g_ent[r, c].unsqueeze(-1)
            gx = log_p.add_(ent[r, c].unsqueeze(-1)).mul_(ge).add_(gl).mul_(p).neg_()  # -p (gl + ge (log p + H))
            gx.scatter_add_(-1, ids[r, c].unsqueeze(-1), gl)
            grad[r, c] = gx.div_(ctx.temperature) if ctx.temperature != 1.0 else gx
        return grad, None, None, None, None


def token_logprobs(
    logits: Tensor,
    ids: Tensor,
    *,
    temperature: float = 1.0,
    forbidden: Tensor | None = None,
    chunk_tokens: int = 1024,
) -> tuple[Tensor, Tensor]:
    """log softmax(logits / temperature)[ids] and entropy, chunked — TRL selective_log_softmax + entropy_from_logits.

    logits [N, T, V] (any float dtype; logits[:, t] predicts ids[:, t]), ids [N, T] long, forbidden [V] bool (token
    ids never sampled, e.g. vision placeholders: their logits become -inf, as at sampling time) -> (logp [N, T],
    entropy [N, T]; fp32, fp64 for fp64 logits), both differentiable w.r.t. logits. A target id that is itself
    forbidden gets logp = -inf: such completions must be masked out (and their ids replaced) before the loss.
    """
    if logits.dim() != 3 or ids.shape != logits.shape[:2]:
        raise ValueError(
            f"token_logprobs wants logits [N, T, V] and ids [N, T]; got {tuple(logits.shape)}, {tuple(ids.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (rollout.temperature), got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if forbidden is not None:
        if forbidden.shape != logits.shape[-1:] or forbidden.dtype != torch.bool:
            raise ValueError(
                f"forbidden must be a bool mask over the vocabulary [{logits.shape[-1]}], "
                f"got {tuple(forbidden.shape)} {forbidden.dtype}"
            )
        forbidden = forbidden.to(logits.device)
    ids = ids.long()
    if logits.requires_grad and torch.is_grad_enabled():
        return _ChunkedLogProbs.apply(logits, ids, temperature, forbidden, chunk_tokens)
    logp, ent, _ = _forward(logits, ids, temperature, forbidden, chunk_tokens)
    return logp, ent


def _truncate(x: Tensor, top_k: int, top_p: float) -> Tensor:
    """Keep mask [n, t, V] of vLLM's top-k then top-p truncation of scaled logits x (`apply_top_k_top_p`: ties at the
    k-th value stay; top-p keeps the smallest head whose mass reaches p, measured after top-k, at least one token)."""
    keep = torch.ones_like(x, dtype=torch.bool)
    if top_k > 0 and top_k < x.shape[-1]:
        kth = x.topk(top_k, dim=-1).values[..., -1:]  # [n, t, 1]
        keep &= x >= kth
    if top_p < 1.0:
        sorted_x, order = torch.where(keep, x, torch.full_like(x, -torch.inf)).sort(dim=-1)  # ascending
        tail = sorted_x.softmax(-1).cumsum(-1) <= 1 - top_p  # the low-probability tail that top-p drops
        tail[..., -1] = False
        keep &= ~torch.zeros_like(tail).scatter_(-1, order, tail)
    return keep


@torch.no_grad()
def truncated_token_logprobs(
    logits: Tensor,
    ids: Tensor,
    *,
    temperature: float = 1.0,
    forbidden: Tensor | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
    chunk_tokens: int = 1024,
) -> Tensor:
    """log-probs [N, T] of ids under the distribution the engine samples from and reports (vLLM's
    `processed_logprobs`): softmax(logits / T) truncated to the top-k / top-p support and renormalised there.

    Replaying the truncation is what makes the trainer's log-probs comparable with the engine's (TRL issue 6789: a
    full-vocabulary log-prob differs from the engine's by log of the kept mass). A sampled id that falls just outside
    the replayed support (a rounding tie) is kept. No autograd: only old (behaviour) log-probs need it.
    """
    if top_k <= 0 and top_p >= 1.0:
        return token_logprobs(logits, ids, temperature=temperature, forbidden=forbidden, chunk_tokens=chunk_tokens)[0]
    n, t, _ = logits.shape
    out = torch.empty(n, t, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    forbidden = None if forbidden is None else forbidden.to(logits.device)
    for r, c in _blocks(n, t, chunk_tokens):
        x = logits[r, c].to(out.dtype) / temperature  # [n', t', V]
        if forbidden is not None:
            x = x.masked_fill(forbidden, -torch.inf)
        target = ids[r, c].long().unsqueeze(-1)
        keep = _truncate(x, top_k, top_p).scatter_(-1, target, True)
        x = x.masked_fill(~keep, -torch.inf)
        out[r, c] = (x.gather(-1, target) - torch.logsumexp(x, -1, keepdim=True)).squeeze(-1)
    return out
