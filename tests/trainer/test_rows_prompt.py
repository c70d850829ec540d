"""The prompt a run counts and trains on and the prompt its engine samples from are written from one value: the run's
`PromptSettings` (answer format, box convention, system prompt, thinking, video sampling, tools)."""

import pytest
from trainer_helpers import tiny_config, write_reward_module

import vlgrpo.rollout.hf as hf_module
import vlgrpo.rollout.turns as turns_module
import vlgrpo.rollout.vllm.engine as vllm_engine_module
import vlgrpo.trainer.rows as rows_module
from vlgrpo.policy.prompt import build_prompt
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state


def test_the_rows_and_the_engine_write_their_prompts_from_the_runs_one_setting(tmp_path, tiny_model_dir, shapes_dir):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir("qwen2_5_vl"),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "train.steps=1",
        "data.system_prompt=Look closely.",
        "data.answer_format=answer",
    )
    state = build_state(cfg, progress=False)
    try:
        rows, engine = state.rows, state.engine
        assert rows.settings.prompt_kw() == engine.prompt_kw  # one value, not two readings of the config
        assert rows.settings.system_prompt == "Look closely." and rows.settings.answer_format == "answer"
        samples = rows.draw(3)
        for sample, built in zip(samples, engine.build_prompts(samples)):
            assert rows.prompt(sample).input_ids == built.input_ids
    finally:
        state.close()


@pytest.mark.parametrize("tools", [[], ["rollout.tools=[zoom_in]", "rollout.max_turns=2"]], ids=["plain", "tools"])
def test_a_step_builds_each_drawn_samples_prompt_once(tmp_path, tiny_model_dir, shapes_dir, monkeypatch, tools):
    """The rollout takes the prompts the rows built (and checked the length of) instead of building them again: one
    `build_prompt` per drawn sample in a step (before: two, the rows' and the engine's or ToolRollout's)."""
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir("qwen2_5_vl"),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "train.steps=1",
        "rollout.max_new_tokens=4",
        *tools,
    )
    built = []

    def counted(sample, *args, **kwargs):
        built.append(sample.id)
        return build_prompt(sample, *args, **kwargs)

    for module in (rows_module, hf_module, turns_module, vllm_engine_module):
        monkeypatch.setattr(module, "build_prompt", counted)
    state = build_state(cfg, progress=False)
    try:
        Trainer(state).grpo_step()
        drawn = cfg.train.prompts_per_step
        assert len(built) == drawn and len(set(built)) == drawn, built
        if tools:  # the tools' schemas are in the prompt the rollout got
            assert state.rows.tools and "zoom_in" in state.lm.processor.tokenizer.decode(
                state.rows.prompt(state.rows.data.samples[0]).input_ids
            )
    finally:
        state.close()
