"""DAPO overlong shaping and dynamic sampling: exact penalties, dropped-group counts, refill arithmetic.

The refill loop itself is driven through the Trainer in tests/trainer/test_dynamic_sampling.py."""

from __future__ import annotations

import pytest
import torch

from vlgrpo.grpo import filter_zero_variance_groups, overlong_penalty, prompts_needed
from vlgrpo.types import InputError


def test_overlong_penalty_ramp():
    # L = 128, C = 32: 0 up to 96, linear to -1 at 128, -1 beyond
    lengths = torch.tensor([0, 50, 96, 97, 100, 112, 127, 128, 129, 500])
    expected = [0.0, 0.0, 0.0, -1 / 32, -4 / 32, -0.5, -31 / 32, -1.0, -1.0, -1.0]
    assert overlong_penalty(lengths, max_length=128, cache_length=32).tolist() == pytest.approx(expected, abs=1e-7)


def test_overlong_cache_equal_to_length_starts_at_zero_tokens():
    assert overlong_penalty(torch.tensor([0, 2, 4, 9]), 4, 4).tolist() == [0.0, -0.5, -1.0, -1.0]


@pytest.mark.parametrize("cache", [0, 200])
def test_overlong_bad_cache_length_is_named(cache):
    with pytest.raises(InputError, match="reward.overlong needs 0 < cache_length <= max_length"):
        overlong_penalty(torch.tensor([1]), 128, cache)


def test_filter_drops_constant_and_singleton_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.5, 0.5, 2.0, 0.2, 0.3, 0.3])
    ids = torch.tensor([4, 4, 4, 9, 9, 11, 6, 6, 6])  # 4: varied, 9: constant, 11: single, 6: varied
    keep, dropped = filter_zero_variance_groups(rewards, ids)
    assert keep.tolist() == [True, True, True, False, False, False, True, True, True]
    assert dropped == 2


def test_filter_all_informative_and_all_constant():
    ids = torch.tensor([0, 0, 1, 1])
    assert filter_zero_variance_groups(torch.tensor([0.0, 1.0, 1.0, 0.0]), ids)[1] == 0
    keep, dropped = filter_zero_variance_groups(torch.tensor([1.0, 1.0, 0.0, 0.0]), ids)
    assert (keep.tolist(), dropped) == ([False] * 4, 2)


def test_filter_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"both be \[B\*G\]"):
        filter_zero_variance_groups(torch.zeros(4), torch.zeros(3, dtype=torch.long))


def test_prompts_needed_refill_loop():
    # target 8 groups: 5 kept after the first round -> ask for 3 more; full -> 0; surplus -> 0
    assert prompts_needed(5, 8, rounds_done=0, max_rounds=2) == 3
    assert prompts_needed(8, 8, rounds_done=1, max_rounds=2) == 0
    assert prompts_needed(10, 8, rounds_done=1, max_rounds=2) == 0
    # extra rounds spent (or disabled) -> stop asking even if short
    assert prompts_needed(6, 8, rounds_done=2, max_rounds=2) == 0
    assert prompts_needed(0, 8, rounds_done=0, max_rounds=0) == 0


def test_prompts_needed_rejects_nonsense():
    with pytest.raises(ValueError, match="target_groups >= 1"):
        prompts_needed(0, 0, 0, 1)
