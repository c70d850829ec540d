"""The update on the rollout's prompt prefill (`train.prefill_once`): the same gradient as the update's own prompt
pass, one prompt forward per step, and the runs it applies to."""

import pytest
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.policy import forward as forward_module
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.prefill_once import prefill_once
from vlgrpo.trainer.state import build_state


def _state(tmp_path, tiny_model_dir, shapes_dir, arch, name, *extra):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir(arch), shapes_dir, tmp_path / name, f"reward.recipe={{'{spec}': 1.0}}", "train.steps=1", *extra
    )
    return build_state(cfg, progress=False)


def _step(state, monkeypatch):
    """One GRPO step -> (metrics, the gradients the optimiser stepped with, the update's own prompt passes)."""
    passes, grads = [], {}
    prefill_batch = forward_module.prefill_batch
    monkeypatch.setattr(forward_module, "prefill_batch", lambda *a, **k: passes.append(1) or prefill_batch(*a, **k))
    backend_step = state.backend.step

    def step():
        grads.update({n: p.grad.clone() for n, p in state.backend.model.named_parameters() if p.grad is not None})
        return backend_step()

    monkeypatch.setattr(state.backend, "step", step)
    metrics = Trainer(state).grpo_step()
    monkeypatch.setattr(forward_module, "prefill_batch", prefill_batch)
    return metrics, grads, len(passes)


@pytest.mark.parametrize(
    "arch,backend,micro",
    [
        ("qwen2_5_vl", "plain", 2),
        ("qwen2_5_vl", "plain", 6),
        ("qwen2_5_vl", "lora", 2),
        ("qwen3_vl", "lora", 2),
        ("qwen3_5", "plain", 2),
    ],
)
def test_the_update_on_the_rollouts_prefill_has_the_gradient_of_its_own_prompt_pass(
    tmp_path, tiny_model_dir, shapes_dir, arch, backend, micro, monkeypatch
):
    """The same step twice from the same weights and seed: with the rollout's prefill kept as the update's prompt
    pass, and with the update's own. 2 prompts x 3 completions in micro-batches of 2 rows (the second holds a row of
    each prompt: each prompt's gradient gathers over two micro-batches), or in one of all 6 (the kept outputs read
    whole, no gather). The samples,
    loss and every gradient agree to fp32 rounding (Qwen3.5: its Gated DeltaNet states are the kept ones); the
    update's own prompt forward ran only without it."""
    runs = {}
    for on in (True, False):
        extra = (
            f"train.backend={backend}",
            "rollout.completions_per_prompt=3",
            f"train.micro_batch_completions={micro}",
            f"train.prefill_once={str(on).lower()}",
        )
        state = _state(tmp_path, tiny_model_dir, shapes_dir, arch, f"run_{on}", *extra)
        assert state.engine.keep_prefill is on
        runs[on] = _step(state, monkeypatch)
        state.close()
    (kept, kept_grads, kept_passes), (own, own_grads, own_passes) = runs[True], runs[False]
    assert (kept_passes, own_passes) == (0, 6 // micro)  # the rollout's prefill served every micro-batch
    assert kept["reward/total"] == own["reward/total"] and kept["grpo/response_length"] == own["grpo/response_length"]
    assert abs(kept["train/loss"] - own["train/loss"]) <= 1e-6
    assert (
        own["train/grad_norm"] > 0
        and abs(kept["train/grad_norm"] - own["train/grad_norm"]) <= 1e-5 * own["train/grad_norm"]
    )
    assert kept_grads.keys() == own_grads.keys() and own_grads
    for name, g in own_grads.items():
        scale = float(g.abs().max())
        assert (kept_grads[name] - g).abs().max() <= 1e-7 + 1e-5 * scale, name


@pytest.mark.parametrize(
    "extra",
    [
        ("grpo.num_iterations=2",),  # the weights move between the update's passes
        ("model.gradient_checkpointing=true",),  # the update runs whole rows
        ("model.freeze_vision=false",),  # the update re-encodes the images with autograd
        ("train.prefill_once=false",),
    ],
    ids=["iterations", "checkpointing", "trainable-tower", "off"],
)
def test_runs_whose_update_cannot_take_the_rollouts_prefill_prefill_again(tmp_path, tiny_model_dir, shapes_dir, extra):
    state = _state(tmp_path, tiny_model_dir, shapes_dir, "qwen2_5_vl", "run", *extra)
    assert not prefill_once(state) and state.engine.keep_prefill is False
    state.close()


def test_a_batch_of_other_prompts_than_the_kept_ones_is_prefilled_by_the_update(
    tmp_path, tiny_model_dir, shapes_dir, monkeypatch
):
    """Dynamic sampling tops a batch up from a second round: the kept prefill (the last round's prompts) is not the
    batch's, so the update runs its own prompt pass and the engine holds no graph after the step."""
    state = _state(tmp_path, tiny_model_dir, shapes_dir, "qwen2_5_vl", "run")
    real = state.engine.generate_prompts

    def other_prompts(samples, prompts, params, keep_kv=False):
        groups = real(samples, prompts, params, keep_kv)
        if state.engine.kept is not None:  # as if another round's prompts had been prefilled last
            state.engine.kept.prompt_ids = state.engine.kept.prompt_ids.flip(0)
        return groups

    monkeypatch.setattr(state.engine, "generate_prompts", other_prompts)
    _, grads, passes = _step(state, monkeypatch)
    assert passes == 2 and grads and state.engine.kept is None  # its own prompt pass, both micro-batches
    state.close()
