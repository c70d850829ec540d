"""The logged means of a step are the union batch's: micro-batches and ranks weighted by their items (#60 item 4)."""

import torch

from vlgrpo import grpo
from vlgrpo.trainer.metrics import UnionMeans


def test_the_issues_example_logs_the_union_kl_not_rank_0s_mean_of_micro_batch_means():
    """Rank 0: micro-batches of 10 tokens at KL 0.10 and 90 at 0.01; rank 1: 300 tokens at 0.20. Logged before:
    0.055 (rank 0's two micro-batch means averaged); the union's: (1 + 0.9 + 60) / 400 = 0.15475."""
    ranks = [UnionMeans(), UnionMeans()]
    ranks[0].add({"grpo/kl": 0.10}, 10)
    ranks[0].add({"grpo/kl": 0.01}, 90)
    ranks[1].add({"grpo/kl": 0.20}, 300)
    for r, m in enumerate(ranks):
        m.add_max({"grpo/is_max": [1.5, 3.0][r]})
        m.add_count({"reward/failures": [1, 2][r]})
    parts = [(m.sums, m.weights, m.maxima, m.counts) for m in ranks]
    out = ranks[0].reduce(lambda _: parts)  # what every rank gets from gather_from_ranks
    assert abs(out["grpo/kl"] - 0.15475) < 1e-12
    assert out["grpo/is_max"] == 3.0 and out["reward/failures"] == 3.0
    assert ranks[0].reduce()["grpo/kl"] == (1 + 0.9) / 100  # one process: its own micro-batches, token-weighted


def test_a_mean_over_no_item_adds_nothing():
    m = UnionMeans()
    m.add({"rollout/logprob_abs_diff": float("nan")}, 0)  # no token had an engine log-prob
    m.add({"rollout/logprob_abs_diff": 0.5}, 4)
    assert m.reduce() == {"rollout/logprob_abs_diff": 0.5}


def test_stat_weights_count_tokens_or_sequences_as_policy_loss_averages_them():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    token = grpo.stat_weights(grpo.token_log_ratio, mask)
    sequence = grpo.stat_weights(grpo.sequence_log_ratio, mask)  # GSPO: one ratio per sequence, averaged over rows
    assert token["ratio_mean"] == token["entropy"] == 4.0
    assert sequence["ratio_mean"] == sequence["clip_frac_low"] == 3.0 and sequence["kl"] == 4.0
