"""Advantage estimators: hand-computed values, degenerate groups, and the readable loop as the oracle."""

from __future__ import annotations

import math

import pytest
import torch

from vlgrpo.grpo import (
    batch_advantages,
    constant_groups,
    group_advantages,
    group_mean_advantages,
)
from vlgrpo.registry import ADVANTAGE


def test_two_right_two_wrong_sample_std():
    # mean 0.5, sample std sqrt(1/3) = 0.57735 -> +-0.5 / (0.57735 + 1e-4) = +-0.86588
    adv, stats = group_advantages(torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 0]))
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert expected == pytest.approx(0.865876, abs=1e-6)
    torch.testing.assert_close(adv, torch.tensor([-expected, -expected, expected, expected]), atol=1e-6, rtol=0)
    assert stats == {"zero_adv_frac": 0.0}


def test_population_std_gives_plus_minus_one():
    adv, _ = group_advantages(
        torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.zeros(4, dtype=torch.long), eps=0.0, unbiased=False
    )
    assert adv.tolist() == [-1.0, -1.0, 1.0, 1.0]


def test_epsilon_is_configurable():
    adv, _ = group_advantages(torch.tensor([0.0, 2.0]), torch.tensor([5, 5]), eps=1.0)
    # mean 1, sample std sqrt(2) -> -1 / (sqrt(2) + 1)
    assert adv.tolist() == pytest.approx([-1 / (math.sqrt(2) + 1), 1 / (math.sqrt(2) + 1)], abs=1e-7)


@pytest.mark.parametrize("name", ["group", "group_mean", "batch"])
def test_constant_and_singleton_groups_give_exact_zero_and_are_counted(name):
    # group 7: all 0.1 (floating mean != 0.1 exactly); group 2: one member; group 4: informative
    rewards = torch.tensor([0.1, 0.1, 0.1, 3.0, 1.0, 0.0])
    ids = torch.tensor([7, 7, 7, 2, 4, 4])
    adv, stats = ADVANTAGE.load(name)(rewards, ids)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert adv[4] > 0 and adv[5] < 0
    assert stats["zero_adv_frac"] == pytest.approx(4 / 6)


def test_group_mean_is_dr_grpo_centering_only():
    adv, _ = group_mean_advantages(torch.tensor([0.0, 0.0, 0.0, 4.0, 1.0, 3.0]), torch.tensor([0, 0, 0, 0, 1, 1]))
    assert adv.tolist() == [-1.0, -1.0, -1.0, 3.0, -1.0, 1.0]


def test_batch_std_scaling_centres_per_group_scales_per_batch():
    rewards = torch.tensor([0.0, 1.0, 2.0, 4.0])
    adv, _ = batch_advantages(rewards, torch.tensor([0, 0, 1, 1]), eps=0.0)
    # batch sample std of [0,1,2,4]: mean 1.75, sum sq dev 8.75, /3 -> sqrt(2.91667) = 1.70783
    s = math.sqrt(8.75 / 3)
    assert adv.tolist() == pytest.approx([-0.5 / s, 0.5 / s, -1 / s, 1 / s], abs=1e-6)


def _loop_oracle(rewards, ids, mode, eps=1e-4):
    """The readable version: one group at a time."""
    out = torch.zeros_like(rewards)
    batch_std = rewards.std()
    for gid in ids.unique().tolist():
        idx = (ids == gid).nonzero().flatten()
        r = rewards[idx]
        if len(r) < 2 or bool((r == r[0]).all()):
            continue  # no baseline / no signal -> 0
        centred = r - r.mean()
        out[idx] = {"group": centred / (r.std() + eps), "group_mean": centred, "batch": centred / (batch_std + eps)}[
            mode
        ]
    return out


@pytest.mark.parametrize("mode", ["group", "group_mean", "batch"])
@pytest.mark.parametrize("seed", range(5))
def test_vectorised_equals_loop(mode, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 9, (40,), generator=g) * 3 + 100  # non-contiguous ids, shuffled order, uneven sizes
    rewards = torch.randint(0, 3, (40,), generator=g).float() * 0.5  # ties make some groups constant
    rewards[ids == ids[0]] = 1.0  # at least one constant group
    adv, stats = ADVANTAGE.load(mode)(rewards, ids)
    torch.testing.assert_close(adv, _loop_oracle(rewards, ids, mode), atol=1e-6, rtol=0)
    assert stats["zero_adv_frac"] == pytest.approx(float(constant_groups(rewards, ids).float().mean()))
    assert stats["zero_adv_frac"] > 0


def test_contiguous_groups_reshape_agrees():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(4 * 8, generator=g)
    adv, _ = group_advantages(rewards, torch.arange(4).repeat_interleave(8))
    r = rewards.view(4, 8)
    expected = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
    torch.testing.assert_close(adv, expected.flatten(), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "rewards,ids,match",
    [
        (torch.tensor([[0.0, 1.0]]), torch.tensor([[0, 0]]), "1-D float"),
        (torch.tensor([0.0, 1.0]), torch.tensor([0]), "shaped like rewards"),
        (torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0]), "int tensor"),
        (torch.tensor([0.0, float("nan")]), torch.tensor([0, 0]), r"NaN at rows \[1\]"),
    ],
)
def test_bad_input_is_named(rewards, ids, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, ids)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_matches_trl_advantage_formula(scale):
    """TRL 1.16 `GRPOTrainer._generate_and_score_completions` (trl/trainer/grpo_trainer.py), sum_then_normalize:
    A = r - groupmean; A /= (nanstd + 1e-4) of the group (scale_rewards="group") or of the batch ("batch"),
    with TRL's own Bessel-corrected `trl.trainer.utils.nanstd`; "none" is our group_mean. Contiguous groups of G."""
    nanstd = pytest.importorskip("trl.trainer.utils").nanstd
    g = torch.Generator().manual_seed(7)
    b, k = 6, 4
    rewards = torch.rand(b * k, generator=g)
    rewards[:k] = 0.5  # one zero-variance group: TRL gives 0 / (0 + 1e-4) = 0 too
    grouped = rewards.view(-1, k)
    centred = rewards - grouped.mean(1).repeat_interleave(k)
    if scale == "group":
        expected = centred / (nanstd(grouped, dim=1).repeat_interleave(k) + 1e-4)
    elif scale == "batch":
        expected = centred / (nanstd(rewards) + 1e-4)
    else:
        expected = centred
    ours, _ = ADVANTAGE.load({"group": "group", "batch": "batch", "none": "group_mean"}[scale])(
        rewards, torch.arange(b).repeat_interleave(k)
    )
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)
