"""GRPO advantage estimators: one scalar per completion from its reward and its group's rewards.

Pure tensor functions of `[B·G]` rewards and `[B·G]` group ids (any integers, any order).
Knows nothing of configs, models or how rewards were made.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

AdvantageFn = Callable[..., tuple[Tensor, dict[str, float]]]
SumRanks = Callable[[Tensor], Tensor]
"""Sums a float tensor over the data-parallel ranks (float64 out): how a batch-wide statistic sees the union batch.
The trainer passes `trainer.backends.sum_tensor_over_ranks`; the default is one process."""


def _one_process(values: Tensor) -> Tensor:
    return values.double()


def _check(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1 or not rewards.is_floating_point():
        raise ValueError(f"rewards must be a 1-D float tensor [B*G], got shape {tuple(rewards.shape)} {rewards.dtype}")
    if group_ids.shape != rewards.shape or group_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"group_ids must be an int tensor shaped like rewards {tuple(rewards.shape)}, "
            f"got {tuple(group_ids.shape)} {group_ids.dtype}"
        )
    if torch.isnan(rewards).any():
        bad = torch.nonzero(torch.isnan(rewards)).flatten().tolist()[:8]
        raise ValueError(f"rewards contain NaN at rows {bad}: the reward layer must turn failures into counted zeros")


def constant_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """[B*G] bool: the completion's group has one member or exactly equal rewards (no learning signal).

    Exact equality, not a tolerance: only truly constant groups count (the std of [0.1] * 3 is ~1e-17, not 0).
    """
    uniq, dense = torch.unique(group_ids, return_inverse=True)  # dense: [B*G] in 0..K-1
    k = uniq.numel()
    hi = rewards.new_full((k,), -torch.inf).scatter_reduce_(0, dense, rewards, "amax")
    lo = rewards.new_full((k,), torch.inf).scatter_reduce_(0, dense, rewards, "amin")
    return (hi == lo)[dense]  # a single-member group has hi == lo


def _group_stats(rewards: Tensor, group_ids: Tensor, unbiased: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Per-completion group mean, group std (0 where constant) and the constant-group flag, all [B*G]."""
    uniq, dense = torch.unique(group_ids, return_inverse=True)  # dense: [B*G] in 0..K-1
    k = uniq.numel()
    count = rewards.new_zeros(k).index_add_(0, dense, torch.ones_like(rewards))  # [K]
    mean = (rewards.new_zeros(k).index_add_(0, dense, rewards) / count)[dense]  # [B*G]
    sq = rewards.new_zeros(k).index_add_(0, dense, (rewards - mean) ** 2)  # [K]
    var = sq / (count - 1).clamp(min=1) if unbiased else sq / count  # [K]
    degenerate = constant_groups(rewards, group_ids)
    std = torch.where(degenerate, torch.zeros_like(mean), var.sqrt()[dense])
    return mean, std, degenerate


def _stats(degenerate: Tensor) -> dict[str, float]:
    return {"zero_adv_frac": float(degenerate.float().mean()) if degenerate.numel() else 0.0}


def group_advantages(
    rewards: Tensor, group_ids: Tensor, eps: float = 1e-4, unbiased: bool = True, sum_ranks: SumRanks | None = None
) -> tuple[Tensor, dict[str, float]]:
    """A_i = (r_i - mean_g r) / (std_g r + eps), sample std (n-1) — GRPO (DeepSeekMath); TRL/verl/EasyR1 `grpo`.

    rewards [B*G] float, group_ids [B*G] int -> (advantages [B*G], {"zero_adv_frac": share of completions in a
    group of one or with all-equal rewards; their advantage is exactly 0}). `unbiased=False` uses population std.
    `sum_ranks` is unused: a group never spans ranks (uniform signature).
    """
    _check(rewards, group_ids)
    mean, std, degenerate = _group_stats(rewards, group_ids, unbiased)
    adv = (rewards - mean) / (std + eps)
    return adv.masked_fill(degenerate, 0.0), _stats(degenerate)


def group_mean_advantages(
    rewards: Tensor, group_ids: Tensor, eps: float = 1e-4, sum_ranks: SumRanks | None = None
) -> tuple[Tensor, dict[str, float]]:
    """A_i = r_i - mean_g r, no std — Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero"); TRL scale_rewards="none".

    rewards [B*G], group_ids [B*G] -> (advantages [B*G], {"zero_adv_frac"}); `eps` and `sum_ranks` are unused
    (uniform signature).
    """
    _check(rewards, group_ids)
    mean, _, degenerate = _group_stats(rewards, group_ids, unbiased=True)
    return (rewards - mean).masked_fill(degenerate, 0.0), _stats(degenerate)


def batch_advantages(
    rewards: Tensor, group_ids: Tensor, eps: float = 1e-4, sum_ranks: SumRanks | None = None
) -> tuple[Tensor, dict[str, float]]:
    """A_i = (r_i - mean_g r) / (std_batch r + eps), sample std of all B*G rewards — TRL scale_rewards="batch".

    rewards [B*G], group_ids [B*G] -> (advantages [B*G], {"zero_adv_frac"}). Centred per group, scaled per batch
    (the "LitePPO" recipe of Liu et al. 2025, "Tricks or Traps"); degenerate groups still get exactly 0. On several
    ranks the batch is the union of every rank's rewards: `sum_ranks` sums over the ranks (TRL gathers the rewards).
    """
    _check(rewards, group_ids)
    mean, _, degenerate = _group_stats(rewards, group_ids, unbiased=True)
    batch_std = union_std(rewards, sum_ranks or _one_process).to(rewards.device, rewards.dtype)
    adv = (rewards - mean) / (batch_std + eps)
    return adv.masked_fill(degenerate, 0.0), _stats(degenerate)


def union_std(rewards: Tensor, sum_ranks: SumRanks) -> Tensor:
    """Sample std (n - 1) of the rewards of every rank, in float64 (0 for fewer than 2): count and sum first, then
    the squared deviations from the union mean (two passes: no cancellation in sum(r^2) - n mean^2)."""
    r = rewards.detach().double().cpu()
    n, total = sum_ranks(torch.stack([torch.tensor(float(r.numel()), dtype=torch.float64), r.sum()])).tolist()
    if n < 2:
        return torch.zeros((), dtype=torch.float64)
    squares = sum_ranks(((r - total / n) ** 2).sum().reshape(1))[0]
    return (squares / (n - 1)).sqrt()
