"""Parity with TRL 1.16: our policy loss equals TRL's own `GRPOTrainer._compute_loss`, run on a stub trainer.

TRL is a test-only dependency. `_compute_loss` (trl/trainer/grpo_trainer.py) is called unbound with a
`SimpleNamespace` standing in for `self` whose `_get_per_token_logps_and_entropies` returns our log-probs, so
the numbers compared below are computed by TRL's code, not by a re-derivation. Name map (see losses.py):
grpo -> seq-mean-token-mean, bnpo -> token-mean (micro-batch tokens), dapo -> token-mean with the generation
batch's token count (`num_items_in_batch`) as `num_tokens`, dr_grpo -> seq-mean-token-sum-norm with
L_max = max_completion_length; importance_sampling_level="sequence" -> grpo.ratio=sequence.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from vlgrpo.grpo import policy_loss
from vlgrpo.registry import AGGREGATION, RATIO

grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")

N, T, L_MAX = 6, 9, 13  # completions, padded width, max_completion_length (> T so dr_grpo's L is visible)
AGG = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
LEVEL = {"token": "token", "sequence": "sequence"}  # TRL importance_sampling_level -> grpo.ratio


def _batch(level: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float64 log-probs whose ratios straddle both clip edges (token: eps 0.2/0.28; sequence: 3e-4/4e-4)."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    if level == "token":
        old = logp + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
    else:  # one log-ratio drift per sequence: clipped high (A>0), clipped low (A<0), inside, outside but unclipped
        drift = torch.tensor([[1e-3], [-1e-3], [1e-4], [2e-3], [-2e-3], [-2e-4]], dtype=torch.float64)
        old = logp - drift + 1e-4 * torch.randn(N, T, generator=g, dtype=torch.float64)
    lengths = torch.tensor([T, 1, 4, T - 2, 6, 3])
    mask = (torch.arange(T) < lengths[:, None]).long()
    return {
        "logp": logp,
        "old": old,
        "ref": logp + 0.2 * torch.randn(N, T, generator=g, dtype=torch.float64),
        "adv": torch.tensor([1.3, -0.7, 0.4, -1.1, 0.9, -0.2], dtype=torch.float64),
        "mask": mask,
        "entropy": torch.rand(N, T, generator=g, dtype=torch.float64) * 2,
    }


def _trl_loss(b, loss_type, level, beta, eps_low, eps_high, num_items=None, accum=1):
    """Run TRL's `GRPOTrainer._compute_loss` with a stub `self`; returns (loss, d loss / d logp, TRL metrics)."""
    logp = b["logp"].clone().requires_grad_(True)
    n, t = logp.shape
    identity = lambda x, *a, **k: x  # noqa: E731  (single process: gather / reduce are identities)
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, b["entropy"], None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=accum,
        max_completion_length=L_MAX,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=accum),
        accelerator=SimpleNamespace(num_processes=1, gather=identity, reduce=identity, gather_for_metrics=identity),
    )
    inputs = {
        "prompt_ids": torch.zeros(n, 2, dtype=torch.long),
        "prompt_mask": torch.ones(n, 2, dtype=torch.long),
        "completion_ids": torch.zeros(n, t, dtype=torch.long),
        "completion_mask": b["mask"],
        "advantages": b["adv"],
        "old_per_token_logps": b["old"],
        "ref_per_token_logps": b["ref"],
        "num_items_in_batch": torch.tensor(float(b["mask"].sum() if num_items is None else num_items)),
    }
    loss = grpo_trainer.GRPOTrainer._compute_loss(fake, None, inputs)
    loss.backward()
    return loss.detach(), logp.grad, {k: v[-1] for k, v in fake._metrics["train"].items()}


def _our_loss(b, loss_type, level, beta, eps_low, eps_high, **norm):
    logp = b["logp"].clone().requires_grad_(True)
    if loss_type == "dapo":
        norm.setdefault("num_tokens", b["mask"].sum())
    loss, stats = policy_loss(
        logp,
        b["old"],
        b["adv"],
        b["mask"],
        log_ratio=RATIO.load(LEVEL[level]),
        aggregate=AGGREGATION.load(AGG[loss_type]),
        clip_low=eps_low,
        clip_high=eps_high,
        beta=beta,
        ref_logp=b["ref"],
        entropy=b["entropy"],
        max_completion_length=L_MAX,
        **norm,
    )
    loss.backward()
    return loss.detach(), logp.grad, stats


CASES = list(itertools.product(["grpo", "bnpo", "dr_grpo", "dapo"], ["token", "sequence"], [0.0, 0.04], [False, True]))


@pytest.mark.parametrize("loss_type,level,beta,asym", CASES)
def test_loss_grad_and_stats_equal_trl(loss_type, level, beta, asym):
    eps_low, eps_high = (0.2, 0.28 if asym else 0.2) if level == "token" else (3e-4, 4e-4 if asym else 3e-4)
    b = _batch(level)
    trl_loss, trl_grad, trl_stats = _trl_loss(b, loss_type, level, beta, eps_low, eps_high)
    loss, grad, stats = _our_loss(b, loss_type, level, beta, eps_low, eps_high)
    assert abs(float(loss) - float(trl_loss)) < 1e-6 and float(trl_loss) != 0.0
    torch.testing.assert_close(grad, trl_grad, atol=1e-6, rtol=0)
    # the random batch really exercises both clip edges, so a wrong clip would show
    assert trl_stats["clip_ratio/low_mean"] > 0 and trl_stats["clip_ratio/high_mean"] > 0
    assert float(stats["clip_frac_low"]) == pytest.approx(trl_stats["clip_ratio/low_mean"], abs=1e-6)
    assert float(stats["clip_frac_high"]) == pytest.approx(trl_stats["clip_ratio/high_mean"], abs=1e-6)
    assert float(stats["entropy"]) == pytest.approx(trl_stats["entropy"], abs=1e-6)
    if beta:
        assert float(stats["kl"]) == pytest.approx(trl_stats["kl"], abs=1e-6)


def test_dapo_micro_batches_with_global_token_count_equal_trl():
    """TRL dapo under 2-step accumulation divides each micro-batch sum by the generation batch's token count;
    so do we with `num_tokens`, and the micro-batch losses sum to the full-batch loss."""
    b = _batch("token", seed=3)
    total = int(b["mask"].sum())
    ours_sum = trl_sum = 0.0
    for rows in (slice(0, N // 2), slice(N // 2, N)):
        micro = {k: v[rows] for k, v in b.items()}
        trl_loss, trl_grad, _ = _trl_loss(micro, "dapo", "token", 0.04, 0.2, 0.28, num_items=total, accum=2)
        loss, grad, _ = _our_loss(micro, "dapo", "token", 0.04, 0.2, 0.28, num_tokens=total)
        torch.testing.assert_close(grad, trl_grad, atol=1e-6, rtol=0)
        ours_sum, trl_sum = ours_sum + float(loss), trl_sum + float(trl_loss)
    full, _, _ = _our_loss(b, "dapo", "token", 0.04, 0.2, 0.28)
    assert ours_sum == pytest.approx(trl_sum, abs=1e-6)
    assert ours_sum == pytest.approx(float(full), abs=1e-9)
    assert micro["mask"].sum() != total  # the global count is not the micro-batch count
