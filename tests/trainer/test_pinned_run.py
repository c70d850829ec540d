"""A seeded 3-step GRPO run (beta > 0, plain backend, the trainer's own loop) whose loss, total reward and KL are
pinned at every step, as torchtune's recipe tests pin their losses: a refactor that changes any number fails here.
When a change is meant to move these numbers, re-pin them in the same commit and say why in its message."""

import math

from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state

from trainer_helpers import tiny_config, write_reward_module

# step -> (train/loss, reward/total, grpo/kl), measured on the CPU in fp32 with one thread
PINNED = {
    1: (1.601874828338623e-07, 2.1375, 0.0),
    2: (0.0022940337657928467, 1.875, 0.05734606832265854),
    3: (0.0041449181735515594, 1.85, 0.10362392291426659),
}


def _close(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-7)


def test_three_seeded_grpo_steps_reproduce_their_pinned_numbers(tmp_path, tiny_model_dir, shapes_dir):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", f"reward.recipe={{'{spec}': 1.0}}",
                      "train.steps=3", "grpo.beta=0.04", "train.lr=1e-2", "train.seed=0")
    state = build_state(cfg, progress=False)
    history = Trainer(state).train()
    state.close()
    got = {h["step"]: (h["train/loss"], h["reward/total"], h["grpo/kl"]) for h in history}
    assert set(got) == {1, 2, 3}
    for step, want in PINNED.items():
        assert all(_close(g, w) for g, w in zip(got[step], want)), (step, got[step], want)
