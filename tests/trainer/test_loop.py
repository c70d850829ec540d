import torch
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.trainer import run_training
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.metrics import read_metrics
from vlgrpo.trainer.sft import gold_group
from vlgrpo.trainer.state import build_state


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_two_grpo_steps_change_only_trainable_parameters(tmp_path, tiny_model_dir, shapes_dir):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", f"reward.recipe={{'{spec}': 1.0}}")
    state = build_state(cfg, progress=False)
    before = _snapshot(state.backend.model)
    history = Trainer(state).train()
    after = _snapshot(state.backend.model)
    state.close()
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    vision = {n for n in before if ".visual." in f".{n}"}
    assert changed and not changed & vision  # the frozen tower (and merger) never move
    assert any("layers.0." in n for n in changed) and "model.language_model.embed_tokens.weight" in changed
    assert [h["step"] for h in history] == [1, 2]
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward/total",
        "grpo/entropy",
        "grpo/clip_frac_high",
        "timing/rollout",
        "timing/update",
        "timing/step",
        "vision/hit_rate",
        "rollout/prefill_tokens",
        "memory/peak_rss_gb",
    ):
        assert key in rows[-1], key
    assert rows[0]["grpo/zero_adv_frac"] < 1.0  # the length reward gives the groups variance
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert spec in saved and "steps: 2" in saved


def test_encoder_runs_once_per_unique_image_per_step(tmp_path, tiny_model_dir, shapes_dir):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "grpo.num_iterations=2",
        "grpo.beta=0.04",
        "train.steps=1",
    )
    state = build_state(cfg, progress=False)
    (row,) = Trainer(state).train()
    state.close()
    # 2 prompts, 2 distinct images: rollout, old, ref and update passes reuse the features (no pixels anywhere)
    assert row["vision/images_encoded"] == 2 and row["vision/encoder_calls"] == 1
    assert row["vision/misses"] == 2 and row["vision/hits"] >= 2
    assert row["rollout/prefill_tokens"] > 0 and row["rollout/prompts"] == 2


def test_sft_lowers_the_loss_on_gold_answers(tmp_path, tiny_model_dir, shapes_dir):
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        "train.stage=sft",
        "train.steps=12",
        "train.prompts_per_step=8",
        "train.micro_batch_completions=8",
        "train.lr=3e-3",
    )
    history = run_training(cfg, progress=False)
    losses = [h["train/loss"] for h in history]
    assert losses[-1] < 0.6 * losses[0]
    assert "reward/total" not in history[-1]  # no rollout in SFT


def test_trainable_vision_tower_is_updated_through_re_encoded_features(tmp_path, tiny_model_dir, shapes_dir):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "model.freeze_vision=false",
        "model.freeze_merger=false",
        "grpo.beta=0.04",
    )
    state = build_state(cfg, progress=False)
    before = _snapshot(state.backend.model)
    history = Trainer(state).train()
    after = _snapshot(state.backend.model)
    assert state.ref_cache is not None  # the reference keeps its own (initial) tower's features
    state.close()
    moved_vision = [n for n in before if ".visual." in f".{n}" and not torch.equal(before[n], after[n])]
    assert any(".merger." in n for n in moved_vision) and any(".blocks." in n for n in moved_vision)
    # phase 2 encodes each step's 2 images; the update pass re-encodes them with grad (one call per micro-batch)
    assert all(h["vision/images_encoded"] >= 4 for h in history)


def test_a_fresh_run_refuses_to_mix_with_an_earlier_runs_checkpoints(tmp_path, tiny_model_dir, shapes_dir):
    import pytest

    from vlgrpo.config import ConfigError

    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", "train.steps=1")
    run_training(cfg, progress=False)
    again = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", "train.steps=1", "train.resume=false")
    with pytest.raises(ConfigError, match="train.resume is false"):
        build_state(again, progress=False)
    assert len(read_metrics(tmp_path / "run")) == 1  # nothing was appended or overwritten


def _eval_run(tmp_path, tiny_model_dir, shapes_dir, evaluator, *overrides):
    """A 3-step run with in-loop eval at every step and a checkpoint every 2 steps (and at the last one)."""
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        "train.steps=3",
        "train.save_every=2",
        "eval.every_steps=1",
        *overrides,
    )
    return run_training(cfg, progress=False, evaluator=evaluator)


def test_a_steps_checkpoint_is_written_before_its_eval(tmp_path, tiny_model_dir, shapes_dir):
    seen = {}

    def evaluator(state):
        seen[state.step] = (state.run_dir / "checkpoints" / f"step_{state.step}").is_dir()
        return {"eval/probe/step": float(state.step)}

    _eval_run(tmp_path, tiny_model_dir, shapes_dir, evaluator)
    assert seen == {1: False, 2: True, 3: True}  # save_every=2, and the last step
    rows = read_metrics(tmp_path / "run")
    assert [(r["eval/probe/step"], r["eval/failures"]) for r in rows] == [(1.0, 0.0), (2.0, 0.0), (3.0, 0.0)]


def test_an_eval_that_raises_is_counted_and_the_run_goes_on(tmp_path, tiny_model_dir, shapes_dir, capsys):
    def evaluator(state):
        if state.step == 2:
            raise RuntimeError("CUDA out of memory while decoding")
        return {"eval/probe/step": float(state.step)}

    history = _eval_run(tmp_path, tiny_model_dir, shapes_dir, evaluator)
    assert [h["step"] for h in history] == [1, 2, 3]
    rows = read_metrics(tmp_path / "run")
    assert [r["eval/failures"] for r in rows] == [0.0, 1.0, 1.0]  # a run total
    assert "eval/probe/step" not in rows[1] and rows[2]["eval/probe/step"] == 3.0
    assert rows[1]["timing/eval"] >= 0 and "train/loss" in rows[1]  # the step's own metrics are all there
    assert (tmp_path / "run" / "checkpoints" / "step_2").is_dir()
    err = capsys.readouterr().err
    assert (
        "warning: in-loop eval at step 2 failed, training goes on (eval/failures = 1): RuntimeError: CUDA out "
        "of memory while decoding"
    ) in err


def test_an_interrupted_eval_still_stops_the_run(tmp_path, tiny_model_dir, shapes_dir):
    import pytest

    def evaluator(state):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _eval_run(tmp_path, tiny_model_dir, shapes_dir, evaluator, "train.steps=1")
    assert (tmp_path / "run" / "checkpoints" / "step_1").is_dir()  # written before the eval began


def test_eval_failures_carry_over_a_resume(tmp_path, tiny_model_dir, shapes_dir):
    """`eval/failures` is a run total: a resumed run goes on counting from its checkpoint's meta.json."""

    def evaluator(state):
        if state.step == 1:
            raise RuntimeError("decoding failed")
        return {}

    _eval_run(tmp_path, tiny_model_dir, shapes_dir, evaluator)
    _eval_run(tmp_path, tiny_model_dir, shapes_dir, evaluator, "train.steps=4", "train.resume=true")
    assert [(r["step"], r["eval/failures"]) for r in read_metrics(tmp_path / "run")] == [
        (1, 1.0),
        (2, 1.0),
        (3, 1.0),
        (4, 1.0),
    ]


def test_the_sft_gold_of_a_prompt_that_opens_think_teaches_what_follows_it(tmp_path, tiny_model_dir, shapes_dir):
    """Qwen3.5's template opens <think> in the prompt: the SFT target's tokens start inside the block (the tag is
    not taught twice) and its text is the whole turn, as the engines write a completion's."""
    cfg = tiny_config(
        tiny_model_dir("qwen3_5"), shapes_dir, tmp_path / "run", "train.stage=sft", "data.answer_format=think_answer"
    )
    state = build_state(cfg, progress=False)
    try:
        sample = state.rows.draw(1)[0]
        group = gold_group(state, sample)
        prompt_tail = state.tokenizer.decode(group.prompt_ids[-8:])
    finally:
        state.close()
    taught = state.tokenizer.decode(group.completions[0].token_ids, skip_special_tokens=True)
    assert prompt_tail.endswith("<think>\n") and not taught.startswith("<think>")
    assert group.completions[0].text == "<think>\n" + taught and "</think><answer>" in taught
