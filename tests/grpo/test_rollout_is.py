"""Rollout importance sampling: hand-computed weights, the formulas as TRL 1.16 and ms-swift write them, the
trainer-side replay of top-k / top-p truncation, and the weights inside the policy loss."""

import math

import pytest
import torch

from vlgrpo.grpo import policy_loss
from vlgrpo.grpo.logprobs import token_logprobs, truncated_token_logprobs
from vlgrpo.grpo.rollout_is import (
    ROLLOUT_IS_MODES,
    logprob_gap,
    resolve_mode,
    rollout_is_weights,
)

OLD = torch.tensor([[-1.0, -2.0, 0.0]])
ENGINE = torch.tensor([[-1.5, -1.0, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0]])  # the third position is padding: ignored whatever its values


def test_hand_computed_weights_for_every_mode():
    e5, em1 = math.exp(0.5), math.exp(-1.0)  # token ratios 1.6487, 0.3679
    expect = {
        ("token_truncate", 1.5): [1.5, em1],
        ("token_mask", 1.5): [0.0, em1],
        ("token_truncate", 3.0): [e5, em1],
        ("sequence_truncate", 0.5): [0.5, 0.5],  # exp(0.5 - 1) = 0.6065 > 0.5
        ("sequence_mask", 0.5): [0.0, 0.0],
        ("sequence_mask", 3.0): [math.exp(-0.5)] * 2,
    }
    for (mode, cap), want in expect.items():
        w, stats = rollout_is_weights(OLD, ENGINE, MASK, mode, cap)
        assert torch.allclose(w[0, :2], torch.tensor(want), atol=1e-6), (mode, cap, w)
    w, stats = rollout_is_weights(OLD, ENGINE, MASK, "token_truncate", 1.5)
    assert math.isclose(float(stats["is_mean"]), (e5 + em1) / 2, rel_tol=1e-6)
    assert math.isclose(float(stats["is_max"]), e5, rel_tol=1e-6) and float(stats["is_clipped_frac"]) == 0.5
    geo, _ = rollout_is_weights(OLD, ENGINE, MASK, "sequence_truncate", 3.0, sequence="geometric_mean")
    assert torch.allclose(geo[0, :2], torch.tensor([math.exp(-0.25)] * 2))  # exp(mean(0.5, -1))


def test_nan_engine_logprobs_give_ratio_one_and_bad_arguments_are_named():
    engine = torch.tensor([[float("nan"), -2.0, 0.0]])
    w, _ = rollout_is_weights(OLD, engine, MASK, "token_truncate", 3.0)
    assert w[0, :2].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="grpo.rollout_is must be one of"):
        rollout_is_weights(OLD, ENGINE, MASK, "token_clip", 3.0)
    with pytest.raises(ValueError, match="grpo.rollout_is_cap must be > 0"):
        rollout_is_weights(OLD, ENGINE, MASK, "token_mask", 0.0)
    assert resolve_mode("auto", True) == "sequence_mask" and resolve_mode("auto", False) == "none"
    assert resolve_mode("token_mask", False) == "token_mask"


def _trl_1_16(old, sampling, mask, mode, clip_max, clip_min=None):
    """The IS ratio exactly as TRL 1.16 writes it (trl/trainer/grpo_trainer.py, `_generate_and_score_completions`)."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    lo = clip_min if clip_min is not None else -math.inf
    hi = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < lo) | (ratio > hi), value=0.0)


def _ms_swift(old, sampling, mask, mode, threshold):
    """ms-swift's `_apply_rollout_importance_sampling` (swift/trainers/rlhf_trainer/grpo_trainer.py), token and
    truncate modes; its sequence ratio is the geometric mean of the token ratios."""
    ratio = torch.exp(torch.clamp(old - sampling, -20.0, 20.0))
    if mode == "token_truncate":
        return torch.clamp(ratio, max=threshold)
    if mode == "token_mask":
        return torch.where(ratio <= threshold, ratio, torch.zeros_like(ratio))
    log_ratio = torch.log(ratio.clamp(min=1e-10))
    seq = torch.exp((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))
    return torch.clamp(seq, max=threshold).unsqueeze(-1).expand_as(ratio)


def test_weights_equal_trl_and_ms_swift_formulas_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 9, generator=g) * 3
    engine = old + torch.randn(6, 9, generator=g) * 0.6
    mask = (torch.rand(6, 9, generator=g) > 0.2).float()
    mask[2] = 0.0  # an empty completion
    for mode in ROLLOUT_IS_MODES[1:]:
        for cap in (0.8, 1.3, 3.0):
            ours, _ = rollout_is_weights(old, engine, mask, mode, cap)
            trl = _trl_1_16(old, engine, mask, mode, cap).expand_as(old)
            assert torch.allclose(ours * mask, trl * mask, atol=1e-6), (mode, cap)
    for mode in ("token_truncate", "token_mask", "sequence_truncate"):
        ours, _ = rollout_is_weights(old, engine, mask, mode, 1.3, sequence="geometric_mean")
        assert torch.allclose(ours * mask, _ms_swift(old, engine, mask, mode, 1.3) * mask, atol=1e-6), mode


def test_truncated_logprobs_replay_top_k_and_top_p_on_the_renormalised_support():
    logits = torch.tensor([[[2.0, 1.0, 0.5, -1.0, 0.0]]])  # [1, 1, V=5]
    forbidden = torch.tensor([False, False, False, False, True])
    ids = torch.tensor([[1]])
    full = token_logprobs(logits, ids, forbidden=forbidden)[0]
    assert torch.equal(truncated_token_logprobs(logits, ids, forbidden=forbidden), full)  # no truncation
    top2 = truncated_token_logprobs(logits, ids, forbidden=forbidden, top_k=2)
    assert math.isclose(float(top2), 1.0 - math.log(math.exp(2.0) + math.exp(1.0)), rel_tol=1e-6)
    # kept mass S: full - truncated = log S (the bias TRL issue 6789 describes)
    p = torch.softmax(logits[0, 0, :4], -1)
    assert math.isclose(float(full - top2), math.log(float(p[:2].sum())), rel_tol=1e-5)
    # top-p 0.9 at T = 0.5: probs of (2, 1, 0.5, -1)/0.5 -> the head {0, 1} holds >= 0.9 of the mass
    q = torch.softmax(logits[0, 0, :4] / 0.5, -1)
    assert float(q[0]) < 0.9 < float(q[:2].sum())
    top_p = truncated_token_logprobs(logits, ids, forbidden=forbidden, temperature=0.5, top_p=0.9)
    assert math.isclose(float(top_p), math.log(float(q[1] / q[:2].sum())), rel_tol=1e-5)
    # a sampled id outside the replayed support (a rounding tie at the boundary) is kept, never -inf
    assert torch.isfinite(truncated_token_logprobs(logits, torch.tensor([[3]]), top_k=1))


def test_is_weights_scale_the_surrogate_before_the_kl_term():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0]])
    adv, mask = torch.tensor([2.0]), torch.ones(1, 2)
    w = torch.tensor([[0.5, 0.0]])
    loss, _ = policy_loss(logp, None, adv, mask, beta=0.1, ref_logp=ref, is_weights=w)
    kl = (math.exp(-0.5) + 0.5 - 1) + 0.0  # k3 per token: exp(d) - d - 1
    assert math.isclose(float(loss.detach()), (-2.0 * 0.5 + 0.0 + 0.1 * kl) / 2, rel_tol=1e-6)
    loss.backward()
    assert logp.grad[0, 1] == 0.0  # a masked-out token contributes no policy gradient (and its KL is 0 here)


def test_logprob_gap_ignores_padding_and_missing_engine_values():
    trainer = torch.tensor([[-1.0, -2.0, -3.0]])
    engine = torch.tensor([[-1.1, float("nan"), -9.0]])
    mean, worst = logprob_gap(trainer, engine, torch.tensor([[1.0, 1.0, 0.0]]))
    assert math.isclose(mean, 0.1, rel_tol=1e-5) and math.isclose(worst, 0.1, rel_tol=1e-5)
    assert all(math.isnan(x) for x in logprob_gap(trainer, engine, torch.zeros(1, 3)))
