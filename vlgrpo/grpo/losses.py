"""GRPO policy losses: importance ratios (token / GSPO / GSPO-token), clipped surrogate, k3 KL, aggregation.

Pure tensor functions over `[N, T]` per-token log-probs (N = B·G completions of a micro-batch) and a completion
mask; the trainer picks a ratio level and an aggregation once (`vlgrpo.registry.RATIO` / `AGGREGATION`). Knows no
config.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from vlgrpo.types import InputError

RatioFn = Callable[[Tensor, Tensor, Tensor], Tensor]
AggregateFn = Callable[..., Tensor]


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator exp(ref - logp) - (ref - logp) - 1 of KL(pi || ref) — Schulman 2020; DeepSeekMath; TRL."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


# --- importance ratios: each returns log rho, [N, T] (token level) or [N, 1] (sequence level) -------------------


def token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """log rho_it = logp_it - old_it — PPO / GRPO token ratio. [N, T] x3 -> [N, T]."""
    return logp - old_logp


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """log s_i = mean_t log rho_it over the completion — GSPO (Zheng et al. 2025); TRL level="sequence".

    [N, T] x3 -> [N, 1]; an empty completion gets log s = 0.
    """
    m = mask.bool()
    log_rho = torch.where(m, logp - old_logp, torch.zeros_like(logp))  # [N, T]
    return log_rho.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1).to(logp.dtype)


def sequence_token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """log s_it = sg[log s_i] + logp_it - sg[logp_it] — GSPO-token (Zheng et al. 2025); verl `gspo`.

    [N, T] x3 -> [N, T]: the value of s_i at every token, the gradient of a token ratio, so per-token advantages
    can differ; with one advantage per sequence and seq-mean-token-mean it equals GSPO in value and gradient.
    """
    return sequence_log_ratio(logp, old_logp, mask).detach() + logp - logp.detach()


# --- aggregations: [N, T] per-token loss and mask -> scalar ----------------------------------------------------------
# Name map to TRL 1.x `loss_type` (tests/grpo/test_trl_parity.py): grpo -> seq-mean-token-mean; bnpo -> token-mean;
# dapo -> token-mean with num_tokens = the generation batch's active tokens (TRL's `num_items_in_batch`); dr_grpo ->
# seq-mean-token-sum-norm with max_completion_length. TRL importance_sampling_level="sequence" -> grpo.ratio=sequence.
# All take the same keywords so the trainer can call any of them; each uses the normaliser it needs. For gradient
# accumulation pass the count of the whole optimiser batch, so summing micro-batch losses gives the full-batch loss;
# on N data-parallel ranks whose gradients are averaged, the union batch's count / N
# (trainer.ranks.global_normalisers).


def _masked_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    # where, not multiply: a non-finite value at a padded position must not turn the sum into NaN
    return torch.where(mask.bool(), per_token, torch.zeros_like(per_token)).sum()


def token_mean(per_token: Tensor, mask: Tensor, *, num_tokens: float | Tensor | None = None, **_: object) -> Tensor:
    """sum_it l_it / num_tokens (default: active tokens here) — DAPO (Yu et al. 2025); TRL bnpo, dapo."""
    denom = (mask.sum() if num_tokens is None else torch.as_tensor(num_tokens)).to(per_token.dtype)
    # no tokens at all (every row masked): the sum is 0, and so is the loss. Not clamp(min=1): a rank's share of a
    # global count (count / world size) may be below 1
    return _masked_sum(per_token, mask) / torch.where(denom > 0, denom, torch.ones_like(denom))


def seq_mean_token_mean(per_token: Tensor, mask: Tensor, *, num_sequences: float | None = None, **_: object) -> Tensor:
    """sum_i (sum_t l_it / |y_i|) / num_sequences (default N) — GRPO (Shao et al. 2024); TRL grpo."""
    m = mask.bool()
    per_seq = torch.where(m, per_token, torch.zeros_like(per_token)).sum(-1) / m.sum(-1).clamp(min=1)
    return per_seq.sum() / (per_token.shape[0] if num_sequences is None else num_sequences)


def seq_mean_token_sum_norm(
    per_token: Tensor,
    mask: Tensor,
    *,
    max_completion_length: int | None = None,
    num_sequences: float | None = None,
    **_: object,
) -> Tensor:
    """sum_it l_it / (num_sequences * L_max) — Dr.GRPO (Liu et al. 2025); TRL dr_grpo."""
    if max_completion_length is None or max_completion_length <= 0:
        raise InputError(
            "aggregation 'seq-mean-token-sum-norm' needs max_completion_length > 0 (pass rollout.max_new_tokens), "
            f"got {max_completion_length!r}"
        )
    n = per_token.shape[0] if num_sequences is None else num_sequences
    return _masked_sum(per_token, mask) / (n * max_completion_length)


# --- the loss ---------------------------------------------------------------------------------------------------------


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float, dual_clip: float | None = None
) -> Tensor:
    """-min(rho A, clip(rho, 1-eps_low, 1+eps_high) A) — PPO; clip-higher from DAPO; dual-clip (Ye et al. 2020)
    caps the loss at -c A when A < 0. ratio [N, T] or [N, 1], adv broadcastable -> per-token loss, same shape."""
    loss = -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.min(loss, -dual_clip * adv), loss)
    return loss


def _mean(x: Tensor, mask: Tensor) -> Tensor:
    """Token-weighted masked mean of an [N, T] stat; a sequence-level [N, 1] stat is averaged over rows (as TRL)."""
    x = x.detach().float()
    if x.shape != mask.shape:
        return x.mean()
    m = mask.bool()
    return torch.where(m, x, torch.zeros_like(x)).sum() / m.sum().clamp(min=1)


def stat_weights(log_ratio: RatioFn, mask: Tensor) -> dict[str, float]:
    """How many items each of `policy_loss`'s stats averages over, to combine micro-batches and ranks: the scored
    tokens, or for the ratio's stats (clip fractions, ratio mean) the sequences where `log_ratio` gives one ratio per
    sequence ([N, 1]: GSPO), as `_mean` averages them."""
    tokens = float(mask.sum())
    probe = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    per_sequence = log_ratio(probe, probe, mask).shape != mask.shape
    ratio = float(mask.shape[0]) if per_sequence else tokens
    return {
        **dict.fromkeys(("clip_frac_low", "clip_frac_high", "clip_frac_dual", "ratio_mean"), ratio),
        **dict.fromkeys(("approx_kl", "kl", "entropy"), tokens),
    }


def policy_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    log_ratio: RatioFn = token_log_ratio,
    aggregate: AggregateFn = token_mean,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    num_tokens: float | Tensor | None = None,
    num_sequences: float | None = None,
    max_completion_length: int | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped-surrogate GRPO loss + beta * k3 KL added after clipping (TRL `GRPOTrainer._compute_loss`).

    logp [N, T] (with grad), old_logp [N, T] (None: on-policy, logp.detach()), advantages [N], mask [N, T] (1 on
    completion tokens), ref_logp [N, T] (needed when beta > 0), entropy [N, T] (from `token_logprobs`, optional),
    is_weights [N, T] (rollout importance-sampling weights, `rollout_is.rollout_is_weights`: they multiply the
    clipped surrogate before the KL term is added, as TRL does).
    Returns (scalar loss, stats of 0-d detached tensors: clip_frac_low, clip_frac_high, clip_frac_dual, ratio_mean,
    approx_kl (k3 of old vs current), and kl (k3 vs ref) / entropy when given).
    """
    if logp.dim() != 2 or mask.shape != logp.shape or advantages.shape != logp.shape[:1]:
        raise ValueError(
            f"policy_loss wants logp [N, T], mask [N, T], advantages [N]; got {tuple(logp.shape)}, "
            f"{tuple(mask.shape)}, {tuple(advantages.shape)}"
        )
    if beta > 0 and ref_logp is None:
        raise ValueError("grpo.beta > 0 needs ref_logp (the reference policy's log-probs); pass it or set beta=0")
    if dual_clip is not None and dual_clip <= 1:
        raise InputError(f"grpo.dual_clip must be > 1 (or None), got {dual_clip}")
    old_logp = logp.detach() if old_logp is None else old_logp
    adv = advantages.unsqueeze(-1)  # [N, 1]
    ratio = torch.exp(log_ratio(logp, old_logp, mask))  # [N, T] or [N, 1]
    per_token = clipped_surrogate(ratio, adv, clip_low, clip_high, dual_clip).expand_as(logp)  # [N, T]
    if is_weights is not None:
        per_token = per_token * is_weights
    stats = {
        "clip_frac_low": _mean((ratio < 1 - clip_low) & (adv < 0), mask),
        "clip_frac_high": _mean((ratio > 1 + clip_high) & (adv > 0), mask),
        "clip_frac_dual": _mean((ratio > dual_clip) & (adv < 0), mask)
        if dual_clip
        else torch.zeros((), device=logp.device),
        "ratio_mean": _mean(ratio, mask),
        "approx_kl": _mean(k3_kl(logp, old_logp), mask),
    }
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)  # [N, T]
        stats["kl"] = _mean(kl, mask)
        if beta > 0:
            per_token = per_token + beta * kl
    if entropy is not None:
        stats["entropy"] = _mean(entropy, mask)
    loss = aggregate(
        per_token,
        mask,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
        max_completion_length=max_completion_length,
    )
    return loss, stats
