"""Rollout importance sampling: weights that correct the loss for the gap between the engine that sampled a completion
(vLLM) and the trainer's own forward pass of the same weights — truncated (TIS) or masked (MIS), per token or per
sequence. Pure tensor functions; knows no engine and no config.

The weight of token t of completion i is rho_it = exp(logp_old_it - logp_engine_it), where logp_old is the trainer's
log-prob under the weights that sampled (replayed over the same top-k / top-p support as the engine, see
`truncated_token_logprobs`) and logp_engine the engine's processed log-prob. Formulas as written by
TRL 1.16 (`GRPOTrainer._generate_and_score_completions`, trl/trainer/grpo_trainer.py: sequence ratio = exp of the
summed token log-ratios, modes `*_truncate` clamp at the cap, `*_mask` zero the weight beyond it) and ms-swift
(`_apply_rollout_importance_sampling`, swift/trainers/rlhf_trainer/grpo_trainer.py: sequence ratio = geometric mean
of the token ratios). Shapes: N completions, T tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

ROLLOUT_IS_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""`grpo.rollout_is` values (besides `auto`): what happens to a weight beyond `grpo.rollout_is_cap`."""
SEQUENCE_RATIOS = ("product", "geometric_mean")
"""`grpo.rollout_is_sequence`: product of token ratios (TRL) or their geometric mean (ms-swift)."""

TRL_DEFAULT_MODE = "sequence_mask"  # TRL 1.16 GRPOConfig.vllm_importance_sampling_mode
TRL_DEFAULT_CAP = 3.0  # TRL 1.16 GRPOConfig.vllm_importance_sampling_clip_max


def resolve_mode(mode: str, engine_is_off_policy: bool) -> str:
    """`auto` -> TRL's default mode for an engine with its own weights (vLLM), `none` for the HF engine."""
    if mode == "auto":
        return TRL_DEFAULT_MODE if engine_is_off_policy else "none"
    return mode


def rollout_is_weights(
    old_logp: Tensor, engine_logp: Tensor, mask: Tensor, mode: str, cap: float, sequence: str = "product"
) -> tuple[Tensor, dict[str, Tensor]]:
    """IS weights [N, T] (sequence modes: the sequence weight repeated on its tokens) and stats `is_mean`, `is_max`
    (of the raw ratios, over tokens or sequences) and `is_clipped_frac` (truncated or masked share).

    old_logp, engine_logp [N, T] (NaN where the engine gave no log-prob: ratio 1 there, as TRL), mask [N, T].
    """
    if mode not in ROLLOUT_IS_MODES or mode == "none":
        raise ValueError(f"grpo.rollout_is must be one of {', '.join(ROLLOUT_IS_MODES[1:])} here, got {mode!r}")
    if sequence not in SEQUENCE_RATIOS:
        raise ValueError(f"grpo.rollout_is_sequence must be one of {', '.join(SEQUENCE_RATIOS)}, got {sequence!r}")
    if cap <= 0:
        raise ValueError(f"grpo.rollout_is_cap must be > 0, got {cap}")
    m = mask.bool()
    diff = torch.where(m, (old_logp - engine_logp).nan_to_num(0.0), torch.zeros_like(old_logp))  # [N, T]
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)  # [N, 1]
        if sequence == "geometric_mean":
            diff = diff / m.sum(-1, keepdim=True).clamp(min=1)
        valid = m.any(-1, keepdim=True)  # [N, 1]
    else:
        valid = m
    ratio = torch.exp(diff)
    beyond = ratio > cap
    weights = ratio.clamp(max=cap) if mode.endswith("truncate") else ratio.masked_fill(beyond, 0.0)
    stats = {
        "is_mean": _masked_mean(ratio, valid),
        "is_max": ratio[valid].max() if bool(valid.any()) else torch.ones((), dtype=ratio.dtype),
        "is_clipped_frac": _masked_mean(beyond.to(ratio.dtype), valid),
    }
    return weights.expand_as(old_logp).detach(), stats


def _masked_mean(x: Tensor, valid: Tensor) -> Tensor:
    return torch.where(valid, x, torch.zeros_like(x)).sum() / valid.sum().clamp(min=1)


def logprob_gap(trainer_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> tuple[float, float]:
    """(mean, max) |trainer - engine| over the scored tokens that have an engine log-prob; NaN when there are none."""
    valid = mask.bool() & ~torch.isnan(engine_logp)
    if not bool(valid.any()):
        return float("nan"), float("nan")
    d = (trainer_logp - engine_logp).abs()[valid]
    return float(d.mean()), float(d.max())
