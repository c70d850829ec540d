"""The prompt a run counts and trains on and the prompt its engine samples from are written from one value: the run's
`PromptSettings` (answer format, box convention, system prompt, thinking, video sampling, tools)."""

from trainer_helpers import tiny_config, write_reward_module

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
