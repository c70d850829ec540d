"""The prompt a run counts and trains on and the prompt its engine samples from are written from one value: the run's
`PromptSettings` (answer format, box convention, system prompt, thinking, video sampling, tools)."""

import json

import pytest
from trainer_helpers import tiny_config, write_reward_module

import vlgrpo.rollout.hf as hf_module
import vlgrpo.rollout.turns as turns_module
import vlgrpo.rollout.vllm.engine as vllm_engine_module
import vlgrpo.trainer.rows as rows_module
from vlgrpo.policy.prompt import build_prompt
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state


def _config(tmp_path, model_dir, shapes_dir, *overrides):
    """The tiny Qwen2.5-VL run on the shapes data with a length reward, one step, and `overrides`."""
    spec = write_reward_module(tmp_path)
    return tiny_config(
        model_dir, shapes_dir, tmp_path / "run", f"reward.recipe={{'{spec}': 1.0}}", "train.steps=1", *overrides
    )


def test_the_rows_and_the_engine_write_their_prompts_from_the_runs_one_setting(tmp_path, tiny_model_dir, shapes_dir):
    cfg = _config(
        tmp_path,
        tiny_model_dir("qwen2_5_vl"),
        shapes_dir,
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
    cfg = _config(tmp_path, tiny_model_dir("qwen2_5_vl"), shapes_dir, "rollout.max_new_tokens=4", *tools)
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
        if tools:  # the prompt the rollout got is the one ToolRollout builds itself, the tools' schemas in it
            e, sample = state.engine, state.rows.data.samples[0]
            own = build_prompt(sample, e.engine.processor, e.engine.geometry, **e.engine.prompt_kw, tools=e.schemas)
            assert state.rows.prompt(sample).input_ids == own.input_ids
            assert "zoom_in" in state.lm.processor.tokenizer.decode(own.input_ids)
    finally:
        state.close()


def test_two_rows_sharing_an_id_each_get_their_own_prompt(tmp_path, tiny_model_dir, shapes_dir):
    """`vlgrpo data doctor` calls a repeated id an error, but a run reads such a file: its rows' prompts (which the
    rollout now samples from, and the update reads the images of) were cached by id, so the second row got the first
    row's question and image."""
    lines = (shapes_dir / "train.jsonl").read_text().splitlines()
    first, second = json.loads(lines[0]), json.loads(lines[1])
    second["id"] = first["id"]
    for row in (first, second):
        row["image"] = str(shapes_dir / row["image"])
    data = tmp_path / "dup.jsonl"
    data.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    cfg = _config(tmp_path, tiny_model_dir("qwen2_5_vl"), shapes_dir, f"data.train={data}", "data.shuffle=false")
    state = build_state(cfg, progress=False)
    try:
        a, b = state.rows.draw(2)
        assert a.id == b.id and a.question != b.question
        tok = state.lm.processor.tokenizer
        assert b.question in tok.decode(state.rows.prompt(b).input_ids)
        assert state.rows.prompt(b).sources != state.rows.prompt(a).sources
        assert [p.input_ids for p in state.engine.build_prompts([a, b])] == [
            state.rows.prompt(x).input_ids for x in (a, b)
        ]
    finally:
        state.close()
