"""Policy loss: hand-computed clipping, k3 KL, aggregations, GSPO, dual-clip and micro-batch normalisers."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from vlgrpo.grpo import (
    clipped_surrogate,
    k3_kl,
    policy_loss,
    seq_mean_token_mean,
    seq_mean_token_sum_norm,
    sequence_log_ratio,
    sequence_token_log_ratio,
    token_mean,
)
from vlgrpo.registry import AGGREGATION, RATIO
from vlgrpo.types import InputError

E = math.e


def _one_token(log_ratio: float, adv: float, **kw):
    """Loss and d loss / d logp for a single token with logp - old = log_ratio."""
    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    loss, stats = policy_loss(
        logp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1), **kw
    )
    loss.backward()
    return loss.item(), float(logp.grad), stats


def test_ratio_e_positive_advantage_is_clipped_at_1_2():
    loss, grad, stats = _one_token(1.0, 1.0, clip_low=0.2, clip_high=0.2)
    assert loss == pytest.approx(-1.2)
    assert grad == 0.0  # clipped: no gradient
    assert float(stats["clip_frac_high"]) == 1.0 and float(stats["clip_frac_low"]) == 0.0
    assert float(stats["ratio_mean"]) == pytest.approx(E)


def test_ratio_e_negative_advantage_is_not_clipped():
    # -min(e * -1, 1.2 * -1) = e; pessimistic side keeps the gradient d(e^x)/dx = e
    loss, grad, stats = _one_token(1.0, -1.0, clip_low=0.2, clip_high=0.2)
    assert loss == pytest.approx(E)
    assert grad == pytest.approx(E)
    assert float(stats["clip_frac_high"]) == 0.0 and float(stats["clip_frac_low"]) == 0.0


def test_clip_higher_is_asymmetric():
    # ratio 1.25, A > 0: symmetric 0.2 clips to 1.2, DAPO's eps_high 0.28 lets it through
    assert _one_token(math.log(1.25), 1.0, clip_low=0.2, clip_high=0.2)[0] == pytest.approx(-1.2)
    assert _one_token(math.log(1.25), 1.0, clip_low=0.2, clip_high=0.28)[0] == pytest.approx(-1.25)
    # ratio 1.3 > 1.28 is clipped at 1.28
    assert _one_token(math.log(1.3), 1.0, clip_low=0.2, clip_high=0.28)[0] == pytest.approx(-1.28)
    # ratio 0.75, A < 0: -min(-0.75, -0.8) = 0.8, clipped on the low side with either eps_high
    loss, grad, stats = _one_token(math.log(0.75), -1.0, clip_low=0.2, clip_high=0.28)
    assert (loss, grad) == (pytest.approx(0.8), 0.0)
    assert float(stats["clip_frac_low"]) == 1.0


def test_dual_clip_caps_negative_advantage_loss():
    # ratio e^2 = 7.389, A = -1: plain loss 7.389, dual-clip c = 3 caps it at 3 with no gradient
    assert _one_token(2.0, -1.0)[0] == pytest.approx(E**2)
    loss, grad, stats = _one_token(2.0, -1.0, dual_clip=3.0)
    assert (loss, grad) == (pytest.approx(3.0), 0.0)
    assert float(stats["clip_frac_dual"]) == 1.0
    # below c nothing changes; positive advantages are untouched
    assert _one_token(1.0, -1.0, dual_clip=3.0)[0] == pytest.approx(E)
    assert _one_token(2.0, 1.0, clip_low=0.2, clip_high=0.28, dual_clip=3.0)[0] == pytest.approx(-1.28)


def test_k3_kl_values():
    logp = torch.tensor([0.0, 0.0, 0.0, -1.0])
    ref = torch.tensor([1.0, -1.0, 0.0, -1.0])
    # d = ref - logp: e^1 - 1 - 1 = 0.718282, e^-1 + 1 - 1 = 0.367879, 0, 0
    torch.testing.assert_close(k3_kl(logp, ref), torch.tensor([E - 2, 1 / E, 0.0, 0.0]), atol=1e-6, rtol=0)


def test_kl_added_after_clipping():
    # clipped term -1.2 (ratio e, A = 1), plus beta * k3 with ref - logp = -1: 0.1 * e^-1
    logp = torch.tensor([[1.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[0.0]], dtype=torch.float64)
    loss, stats = policy_loss(
        logp,
        torch.zeros(1, 1, dtype=torch.float64),
        torch.ones(1, dtype=torch.float64),
        torch.ones(1, 1),
        clip_low=0.2,
        clip_high=0.2,
        beta=0.1,
        ref_logp=ref,
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.2 + 0.1 / E)
    # the clipped part has no gradient; d k3 / d logp = -e^(ref-logp) + 1 = 1 - 1/e
    assert float(logp.grad) == pytest.approx(0.1 * (1 - 1 / E))
    assert float(stats["kl"]) == pytest.approx(1 / E)


# --- aggregations: per-token loss [[1, 2, 3], [4, pad, pad]] ---------------------------------------------------------
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, float("nan")]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_token_mean():
    assert float(token_mean(LOSS, MASK)) == pytest.approx(10 / 4)
    assert float(token_mean(LOSS, MASK, num_tokens=8)) == pytest.approx(10 / 8)


def test_seq_mean_token_mean():
    assert float(seq_mean_token_mean(LOSS, MASK)) == pytest.approx((2.0 + 4.0) / 2)
    assert float(seq_mean_token_mean(LOSS, MASK, num_sequences=4)) == pytest.approx(6.0 / 4)


def test_seq_mean_token_sum_norm_divides_by_max_completion_length():
    assert float(seq_mean_token_sum_norm(LOSS, MASK, max_completion_length=5)) == pytest.approx(10 / (2 * 5))
    with pytest.raises(InputError, match="max_completion_length"):
        seq_mean_token_sum_norm(LOSS, MASK)


@pytest.mark.parametrize("aggregation", AGGREGATION.names)
@pytest.mark.parametrize("level", RATIO.names)
def test_micro_batches_with_global_normaliser_sum_to_full_batch(aggregation, level):
    g = torch.Generator().manual_seed(1)
    n, t = 8, 7
    logp = -torch.rand(n, t, generator=g, dtype=torch.float64) * 2
    old = logp + 0.2 * torch.randn(n, t, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = (torch.arange(t) < torch.randint(1, t + 1, (n, 1), generator=g)).long()
    kw = dict(
        log_ratio=RATIO.load(level),
        aggregate=AGGREGATION.load(aggregation),
        max_completion_length=10,
        beta=0.05,
        ref_logp=logp.detach() + 0.1,
    )
    full_p = logp.clone().requires_grad_(True)
    full, _ = policy_loss(full_p, old, adv, mask, **kw)
    full.backward()
    micro_p = logp.clone().requires_grad_(True)
    total = 0.0
    for rows in (slice(0, 3), slice(3, 8)):  # uneven micro-batches
        kw["ref_logp"] = logp.detach()[rows] + 0.1
        loss, _ = policy_loss(
            micro_p[rows], old[rows], adv[rows], mask[rows], num_tokens=mask.sum(), num_sequences=n, **kw
        )
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(micro_p.grad, full_p.grad, atol=1e-12, rtol=0)


def test_gspo_sequence_ratio_hand_computed():
    # log-ratios 0.1, 0.3 on two tokens (a padded third is ignored): s = exp(0.2) = 1.2214 > 1 + 4e-4 -> clipped
    logp = torch.tensor([[0.1, 0.3, 5.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    mask = torch.tensor([[1, 1, 0]])
    assert sequence_log_ratio(logp, old, mask).item() == pytest.approx(0.2)
    gspo = partial(
        policy_loss,
        log_ratio=RATIO.load("sequence"),
        aggregate=AGGREGATION.load("seq-mean-token-mean"),
        clip_low=3e-4,
        clip_high=4e-4,
    )  # the sequence-level ratio, clipped in [1 - 3e-4, 1 + 4e-4]
    loss, stats = gspo(logp, old, torch.tensor([2.0]), mask)
    assert loss.item() == pytest.approx(-2 * 1.0004)
    assert float(stats["clip_frac_high"]) == 1.0 and float(stats["ratio_mean"]) == pytest.approx(math.exp(0.2))
    # inside the range: loss -A s, d/d logp_t = -A s / |y| on real tokens, 0 on padding
    logp2 = torch.tensor([[1e-4, -1e-4, 5.0]], requires_grad=True)
    loss2, _ = gspo(logp2, old, torch.tensor([2.0]), mask)
    loss2.backward()
    assert loss2.item() == pytest.approx(-2.0, abs=1e-7)
    torch.testing.assert_close(logp2.grad, torch.tensor([[-1.0, -1.0, 0.0]]), atol=1e-6, rtol=0)


def test_gspo_token_equals_gspo_with_sequence_advantages():
    g = torch.Generator().manual_seed(2)
    logp = -torch.rand(5, 6, generator=g, dtype=torch.float64)
    drift = torch.tensor([[1e-3], [-1e-3], [1e-4], [2e-3], [-2e-3]], dtype=torch.float64)  # seq log-ratio ~ drift
    old = logp - drift + 1e-4 * torch.randn(5, 6, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0], dtype=torch.float64)  # rows 0 and 1 clipped high / low
    mask = (torch.arange(6) < torch.tensor([[6], [2], [4], [1], [5]])).long()
    results = []
    for level in ("sequence", "sequence_token"):
        p = logp.clone().requires_grad_(True)
        loss, stats = policy_loss(
            p,
            old,
            adv,
            mask,
            log_ratio=RATIO.load(level),
            aggregate=AGGREGATION.load("seq-mean-token-mean"),
            clip_low=3e-4,
            clip_high=4e-4,
        )
        loss.backward()
        results.append((loss.item(), p.grad, stats))
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-12, rtol=0)
    assert float(results[0][2]["clip_frac_high"]) == pytest.approx(0.2) == float(results[0][2]["clip_frac_low"])
    # and the token variant's value is s_i at every token
    s = sequence_log_ratio(logp, old, mask).exp()
    torch.testing.assert_close(sequence_token_log_ratio(logp, old, mask).exp(), s.expand(5, 6))


def test_on_policy_old_none_gives_ratio_one_and_plain_policy_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, stats = policy_loss(logp, None, torch.tensor([0.5]), torch.ones(1, 2), aggregate=token_mean)
    loss.backward()
    assert loss.item() == pytest.approx(-0.5)
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, -0.25]]))
    assert float(stats["ratio_mean"]) == 1.0 and float(stats["approx_kl"]) == 0.0


def test_clipped_surrogate_broadcasts_sequence_ratio():
    out = clipped_surrogate(torch.tensor([[E], [1.0]]), torch.tensor([[1.0], [-2.0]]), 0.2, 0.28)
    torch.testing.assert_close(out, torch.tensor([[-1.28], [2.0]]))


def test_the_registry_names_the_key_and_choices():
    assert AGGREGATION.load("token-mean") is token_mean
    assert RATIO.load("gspo") is RATIO.load("sequence") is sequence_log_ratio  # a former name still loads
    with pytest.raises(ValueError, match=r"grpo.ratio='ppo' is not one of token, sequence, sequence_token"):
        RATIO.load("ppo")


def test_bad_arguments_are_named():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages \\[N\\]"):
        policy_loss(x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="beta > 0 needs ref_logp"):
        policy_loss(x, x, torch.zeros(2), x, beta=0.1)
    with pytest.raises(InputError, match="dual_clip must be > 1"):
        policy_loss(x, x, torch.zeros(2), x, dual_clip=0.5)
