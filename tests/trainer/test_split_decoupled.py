"""grpo.decoupled (AReaL's decoupled objective) on a split rollout: a stale group's ratio is taken against the
trainer's current (proximal) policy and the behaviour policy enters as capped IS weights exp(proximal - behaviour)."""

from __future__ import annotations

import pytest
from test_split_rollout import _run as _split_run
from trainer_helpers import tiny_config

from vlgrpo.config import ConfigError

DECOUPLED = ("train.steps=3", "rollout.placement=split", "rollout.max_staleness=1", "grpo.decoupled=true")


def _run(tmp_path, tiny_model_dir, shapes_dir, name: str, *overrides: str) -> list[dict]:
    return _split_run(tmp_path, tiny_model_dir, shapes_dir, name, *DECOUPLED, *overrides)


def test_stale_groups_get_is_weights_from_the_proximal_pass(tmp_path, tiny_model_dir, shapes_dir):
    history = _run(tmp_path, tiny_model_dir, shapes_dir, "moving", "train.lr=1e-2")
    assert [h["rollout/staleness"] for h in history] == [0.0, 1.0, 1.0]
    first, stale = history[0], history[1:]
    assert "grpo/is_mean" not in first and "timing/old_logprob" not in first  # fresh groups: no extra pass
    for h in stale:  # one version back: the proximal policy differs from the behaviour one, and is measured
        assert h["timing/old_logprob"] > 0 and h["rollout/logprob_abs_diff"] > 1e-4, h
        assert h["grpo/is_mean"] > 0 and 0 <= h["grpo/is_clipped_frac"] <= 1 and h["train/loss"] == h["train/loss"]


def test_with_unchanged_weights_the_proximal_pass_reproduces_the_behaviour_log_probs(
    tmp_path, tiny_model_dir, shapes_dir
):
    """lr 1e-30 (below fp32 resolution): the worker's older version holds the same weights, so every IS weight is 1
    up to float rounding (both sides run the same model on the same tokens): the pass measures staleness, not noise."""
    history = _run(tmp_path, tiny_model_dir, shapes_dir, "still", "train.lr=1e-30")
    for h in history[1:]:
        assert h["rollout/staleness"] == 1.0
        assert h["rollout/logprob_abs_diff_max"] < 1e-4 and h["grpo/is_mean"] == pytest.approx(1.0, abs=1e-4)


def test_decoupled_needs_a_split_rollout(tmp_path, tiny_model_dir, shapes_dir):
    with pytest.raises(ConfigError, match="grpo.decoupled .* needs rollout.placement=split"):
        tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", "grpo.decoupled=true")
