"""rollout.placement=split: the rollout engine in a worker process of its own. With max_staleness=0 it reproduces the
colocated run exactly (plain backend; LoRA up to the rounding of merged weights); with max_staleness=1 it samples the
next step while the trainer updates, and no group is more than one version old when trained."""

from __future__ import annotations

import pytest

from vlgrpo.config import ConfigError
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state

from trainer_helpers import tiny_config, write_reward_module

KEYS = ("train/loss", "reward/total", "grpo/kl", "grpo/entropy", "train/grad_norm", "grpo/response_length")


def _run(tmp_path, tiny_model_dir, shapes_dir, name: str, *overrides: str) -> list[dict]:
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / name, f"reward.recipe={{'{spec}': 1.0}}",
                      "grpo.beta=0.04", "train.lr=1e-2", "train.seed=0", *overrides)  # fmt: skip
    state = build_state(cfg, progress=False)
    try:
        return Trainer(state).train()
    finally:
        state.close()


def test_split_with_staleness_0_reproduces_the_colocated_run(tmp_path, tiny_model_dir, shapes_dir):
    colocated = _run(tmp_path, tiny_model_dir, shapes_dir, "colocated", "train.steps=3")
    split = _run(tmp_path, tiny_model_dir, shapes_dir, "split", "train.steps=3", "rollout.placement=split",
                 "rollout.max_staleness=0")  # fmt: skip
    for a, b in zip(colocated, split, strict=True):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}, a["step"]  # exactly: same weights, seeds, tokens
        assert b["rollout/staleness"] == 0.0
    assert split[0]["rollout/completions"] == 8  # the worker's engine counters reach the trainer's metrics


def test_split_with_staleness_1_overlaps_and_bounds_staleness(tmp_path, tiny_model_dir, shapes_dir):
    history = _run(tmp_path, tiny_model_dir, shapes_dir, "split1", "train.steps=5", "rollout.placement=split")
    staleness = [h["rollout/staleness"] for h in history]
    assert staleness == [0.0, 1.0, 1.0, 1.0, 1.0]  # step 1 on version 0; then each step sampled one version back
    assert all(h["train/loss"] == h["train/loss"] for h in history)  # finite: the stale ratio is corrected, not NaN
    assert all("timing/rollout_wait" in h and "timing/rollout_worker_idle" in h for h in history)


@pytest.mark.parametrize("overrides, message", [
    (["rollout.max_staleness=1"], "needs rollout.placement=split"),
    (["rollout.placement=split", "grpo.dynamic_sampling=true"], "does not run with grpo.dynamic_sampling"),
    (["rollout.placement=split", "train.backend=zero3"], "does not run with train.backend=zero3"),
    (["rollout.placement=split", "rollout.max_staleness=-1"], "must be >= 0"),
])  # fmt: skip
def test_split_configs_that_cannot_run_are_named(tmp_path, tiny_model_dir, shapes_dir, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", *overrides)


def test_a_resumed_split_run_with_staleness_0_equals_an_uninterrupted_one(tmp_path, tiny_model_dir, shapes_dir):
    """The worker starts afresh on resume and gets the checkpoint's weights before any prompt."""
    whole = _run(tmp_path, tiny_model_dir, shapes_dir, "whole", "train.steps=3", "rollout.placement=split",
                 "rollout.max_staleness=0")  # fmt: skip
    _run(tmp_path, tiny_model_dir, shapes_dir, "cut", "train.steps=2", "rollout.placement=split",
         "rollout.max_staleness=0")  # fmt: skip
    resumed = _run(tmp_path, tiny_model_dir, shapes_dir, "cut", "train.steps=3", "rollout.placement=split",
                   "rollout.max_staleness=0", "train.resume=true")  # fmt: skip
    assert [h["step"] for h in resumed] == [3]
    assert {k: resumed[0][k] for k in KEYS} == {k: whole[2][k] for k in KEYS}


def test_split_runs_the_lora_backend_with_merged_weights(tmp_path, tiny_model_dir, shapes_dir):
    """The worker gets LoRA's merged weights under the base names (W + s·BA, not the adapter's x·W + s·(x·A)·B): with
    staleness 0 the run equals the colocated one up to the rounding of that merge."""
    colocated = _run(tmp_path, tiny_model_dir, shapes_dir, "lora", "train.steps=2", "train.backend=lora")
    split = _run(tmp_path, tiny_model_dir, shapes_dir, "lora_split", "train.steps=2", "train.backend=lora",
                 "rollout.placement=split", "rollout.max_staleness=0")  # fmt: skip
    for a, b in zip(colocated, split, strict=True):
        assert all(b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7) for k in KEYS), (a["step"], a, b)
