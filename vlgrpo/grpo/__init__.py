"""GRPO math as pure tensor functions: advantages, policy losses, chunked log-probs, DAPO batch shaping.

No configs, no models: the trainer picks variants once from the registries (`vlgrpo.registry.ADVANTAGE`, `RATIO`,
`AGGREGATION`) and passes plain numbers. Stats come back keyed without namespace; the trainer prefixes `grpo/`.
"""

from vlgrpo.grpo.advantages import (
    batch_advantages,
    constant_groups,
    group_advantages,
    group_mean_advantages,
)
from vlgrpo.grpo.logprobs import token_logprobs, truncated_token_logprobs
from vlgrpo.grpo.losses import (
    clipped_surrogate,
    k3_kl,
    policy_loss,
    seq_mean_token_mean,
    seq_mean_token_sum_norm,
    sequence_log_ratio,
    sequence_token_log_ratio,
    stat_weights,
    token_log_ratio,
    token_mean,
)
from vlgrpo.grpo.rollout_is import ROLLOUT_IS_MODES, logprob_gap, rollout_is_weights
from vlgrpo.grpo.rollout_is import resolve_mode as resolve_rollout_is
from vlgrpo.grpo.sampling import filter_zero_variance_groups, overlong_penalty, prompts_needed

__all__ = [
    "ROLLOUT_IS_MODES",
    "batch_advantages",
    "clipped_surrogate",
    "constant_groups",
    "filter_zero_variance_groups",
    "group_advantages",
    "group_mean_advantages",
    "k3_kl",
    "logprob_gap",
    "overlong_penalty",
    "policy_loss",
    "prompts_needed",
    "resolve_rollout_is",
    "rollout_is_weights",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
    "sequence_log_ratio",
    "sequence_token_log_ratio",
    "stat_weights",
    "token_log_ratio",
    "token_logprobs",
    "token_mean",
    "truncated_token_logprobs",
]
