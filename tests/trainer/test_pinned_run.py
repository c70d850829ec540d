"""A seeded 3-step GRPO run (beta > 0, plain backend, the trainer's own loop) whose loss, total reward and KL are
pinned at every step, as torchtune's recipe tests pin their losses: a refactor that changes any number fails here.
When a change is meant to move these numbers, re-pin them in the same commit and say why in its message."""

import math

import pytest
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state

# arch -> step -> (train/loss, reward/total, grpo/kl), measured on the CPU in fp32 with one thread
PINNED = {
    "qwen2_5_vl": {
        1: (1.601874828338623e-07, 2.1375, 0.0),
        2: (0.0022940337657928467, 1.875, 0.05734606832265854),
        3: (0.0041449181735515594, 1.85, 0.10362392291426659),
    },
    "qwen3_vl": {  # DeepStack on (init-tiny: 2 maps, into language-model layers 0 and 1)
        1: (-2.1979212760925293e-07, 2.1625, 0.0),
        2: (0.001841627061367035, 1.8125, 0.046040307730436325),
        3: (0.002074994146823883, 1.725, 0.05186977982521057),
    },
    "qwen3_5": {  # hybrid: Gated DeltaNet layers 0-2, gated full attention in layer 3; the prompt opens <think>
        1: (1.4528632164001465e-07, 2.825, 0.0),
        2: (0.002348758280277252, 2.6375, 0.05871741101145744),
        3: (0.003130410797894001, 2.5625000000000004, 0.07825342938303947),
    },
}


def _close(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-7)


def _run(tmp_path, model_dir: str, shapes_dir) -> dict[int, tuple[float, float, float]]:
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        model_dir,
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "train.steps=3",
        "grpo.beta=0.04",
        "train.lr=1e-2",
        "train.seed=0",
    )
    state = build_state(cfg, progress=False)
    history = Trainer(state).train()
    state.close()
    return {h["step"]: (h["train/loss"], h["reward/total"], h["grpo/kl"]) for h in history}


def _matches(got: dict, pinned: dict) -> bool:
    return set(got) == set(pinned) and all(_close(g, w) for s in pinned for g, w in zip(got[s], pinned[s]))


@pytest.mark.parametrize("arch", PINNED)
def test_three_seeded_grpo_steps_reproduce_their_pinned_numbers(tmp_path, tiny_model_dir, shapes_dir, arch):
    got = _run(tmp_path, tiny_model_dir(arch), shapes_dir)
    assert set(got) == {1, 2, 3}
    for step, want in PINNED[arch].items():
        assert all(_close(g, w) for g, w in zip(got[step], want)), (step, got[step], want)


def test_the_qwen3_vl_pin_needs_deepstack(tmp_path, tiny_model_dir, shapes_dir, monkeypatch):
    """The mutation check: the same run with the DeepStack maps never added to the language model's hidden states
    (rollout, old, reference and update passes alike) misses the pin, so the pin holds DeepStack's effect."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

    monkeypatch.setattr(Qwen3VLTextModel, "_deepstack_process", lambda self, hidden_states, *a, **k: hidden_states)
    got = _run(tmp_path, tiny_model_dir("qwen3_vl"), shapes_dir)
    assert set(got) == {1, 2, 3} and not _matches(got, PINNED["qwen3_vl"])


def test_the_qwen3_5_pin_needs_each_rows_prompt_state(tmp_path, tiny_model_dir, shapes_dir, monkeypatch):
    """The mutation check: the same run with the Gated DeltaNet rows starting from a zero state instead of their
    prompt's (the trainer's packed pass and the engine's decode step alike) misses the pin."""
    from vlgrpo.policy import linear_attention, packed
    from vlgrpo.rollout import decode

    def forgetful(attn, h, valid, conv, state, final_state=False):
        return linear_attention.gated_delta(
            attn, h, valid, conv.new_zeros(conv.shape), state.new_zeros(state.shape), final_state
        )

    def forgetful_step(attn, h, conv, state, fused=None):
        return linear_attention.delta_step(attn, h, conv.new_zeros(conv.shape), state.new_zeros(state.shape), fused)

    monkeypatch.setattr(packed, "gated_delta", forgetful)
    monkeypatch.setattr(decode, "delta_step", forgetful_step)
    got = _run(tmp_path, tiny_model_dir("qwen3_5"), shapes_dir)
    assert set(got) == {1, 2, 3} and not _matches(got, PINNED["qwen3_5"])
