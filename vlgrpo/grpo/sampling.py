"""DAPO batch shaping: overlong reward penalty and dynamic sampling (drop zero-variance groups, count the refill).

Pure functions of `[B·G]` tensors and plain counts; the trainer loop that samples more prompts lives upstairs.
Knows nothing of configs, models or engines.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vlgrpo.grpo.advantages import constant_groups
from vlgrpo.types import InputError


def overlong_penalty(lengths: Tensor, max_length: int, cache_length: int) -> Tensor:
    """0 if |y| <= L-C, ((L-C) - |y|) / C if |y| <= L, else -1 — DAPO overlong punishment (Yu et al. 2025).

    lengths [B*G] completion lengths in tokens -> [B*G] float penalty to add to the reward.
    """
    if not 0 < cache_length <= max_length:
        raise InputError(
            f"reward.overlong needs 0 < cache_length <= max_length, got cache_length={cache_length}, "
            f"max_length={max_length}"
        )
    expected = max_length - cache_length
    ramp = (expected - lengths.to(torch.float32)) / cache_length
    return ramp.clamp(min=-1.0, max=0.0)


def filter_zero_variance_groups(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, int]:
    """Keep completions whose group's rewards differ — DAPO dynamic sampling (Yu et al. 2025).

    rewards [B*G], group_ids [B*G] -> (keep [B*G] bool, number of dropped groups). A group of one has no
    variance and is dropped too; constant means exactly equal rewards.
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be [B*G], got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    constant = constant_groups(rewards, group_ids)
    return ~constant, int(torch.unique(group_ids[constant]).numel())


def prompts_needed(kept_groups: int, target_groups: int, rounds_done: int, max_rounds: int) -> int:
    """How many more prompts to sample so the batch has `target_groups` informative groups (DAPO's refill loop).

    Returns 0 once the batch is full or `rounds_done` extra rounds reached `max_rounds` (grpo.max_topup_rounds);
    the trainer then trains on what it has (or trims the surplus to `target_groups`).
    """
    if target_groups < 1 or kept_groups < 0 or rounds_done < 0 or max_rounds < 0:
        raise ValueError(
            f"prompts_needed wants target_groups >= 1 and non-negative counts, got kept={kept_groups}, "
            f"target={target_groups}, rounds_done={rounds_done}, max_rounds={max_rounds}"
        )
    if rounds_done >= max_rounds:
        return 0
    return max(0, target_groups - kept_groups)
