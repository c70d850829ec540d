"""An eval request resolved once (`evals/request.py`) and every engine built by one builder (`rollout/build.py`): the
in-loop eval prompts as training does (data.thinking included) and its metrics at step N equal `vlgrpo eval` of the
step-N checkpoint on the same rows; an eval of a run directory rolls out with the run's tools unless told otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_helpers import tiny_config

from vlgrpo.cli import main
from vlgrpo.evals import run as eval_run
from vlgrpo.evals.run import make_evaluator
from vlgrpo.evals.suite import EvalResult
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "models" / "shapes-tiny-qwen2_5_vl"


@pytest.mark.parametrize("thinking", ["on", "off", "auto"])
def test_the_in_loop_eval_prompts_as_training_does(thinking, tiny_model_dir, shapes_dir, tmp_path, monkeypatch):
    """Qwen3.5's template opens <think> unless data.thinking is off: the in-loop eval's engine used to be built
    without the switch, so a run with thinking off was evaluated with prompts that open <think>."""
    from vlgrpo.data.adapters import load_samples

    cfg = tiny_config(
        tiny_model_dir("qwen3_5"),
        shapes_dir,
        tmp_path / "run",
        f"data.thinking={thinking}",
        f"data.val={shapes_dir / 'val.jsonl'}",
        "eval.every_steps=1",
        "eval.suites=[vqa]",
    )
    seen = []
    monkeypatch.setattr(eval_run, "evaluate", lambda engine, *a, **k: seen.append(engine) or EvalResult({}, []))
    state = build_state(cfg, progress=False)
    try:
        make_evaluator(cfg)(state)
        samples = load_samples(shapes_dir / "val.jsonl").samples
        trained, evaluated = state.engine.build_prompts(samples), seen[0].build_prompts(samples)
    finally:
        state.close()
    assert [p.input_ids for p in evaluated] == [p.input_ids for p in trained]
    assert {p.opened for p in evaluated} == {"" if thinking == "off" else "<think>\n"}


def test_the_in_loop_eval_at_step_n_equals_vlgrpo_eval_of_checkpoint_n(shapes_dir, tmp_path):
    """The shipped caption-pretrained base answers the shapes questions (varied answers, metrics off 0 and 1): two
    GRPO steps with the in-loop eval at step 2, then `vlgrpo eval --model RUN` of the step-2 checkpoint on the same
    rows gives every metric the run logged."""
    run = tmp_path / "run"
    cfg = tiny_config(
        str(SHIPPED),
        shapes_dir,
        run,
        "data.answer_format=answer",
        f"data.val={shapes_dir / 'train.jsonl'}",
        "eval.every_steps=2",
        "eval.suites=[pope, vqa, grounding]",
        "eval.max_samples=12",
        "eval.batch_prompts=8",
        "rollout.max_new_tokens=16",
        "train.save_every=2",
    )
    state = build_state(cfg, progress=False)
    state.evaluator = make_evaluator(cfg)
    try:
        history = Trainer(state).train()
    finally:
        state.close()
    in_loop = {k: v for k, v in history[-1].items() if k.startswith("eval/") and k != "eval/failures"}
    out = tmp_path / "eval"
    args = ["eval", "--model", str(run), "--suite", "pope,vqa,grounding", "--max-samples", "12", "--out", str(out)]
    assert main([*args, "--no-progress"]) == 0
    offline = json.loads((out / "metrics.json").read_text())
    print("in-loop", in_loop, "offline", offline["metrics"])
    assert set(in_loop) == set(offline["metrics"]) and 0 < in_loop["eval/vqa/accuracy"] < 1
    assert in_loop == offline["metrics"]
    assert len({p["completion"] for p in map(json.loads, (out / "predictions.jsonl").open())}) > 3  # varied


def test_an_eval_of_a_tool_trained_run_rolls_out_with_its_tools_unless_told(tiny_model_dir, shapes_dir, tmp_path):
    """The run's rollout.tools and max_turns, as its in-loop eval rolls out (--tools used to default to none);
    --tools none turns them off, --max-turns changes the turns."""
    from vlgrpo.trainer import run_training

    run = tmp_path / "run"
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        run,
        "rollout.tools=[zoom_in]",
        "rollout.max_turns=3",
        "train.steps=1",
    )
    run_training(cfg, progress=False)
    base = ["eval", "--model", str(run), "--suite", "vqa", "--data", str(shapes_dir / "val.jsonl"), "--no-progress"]
    info = {}
    for name, extra in (("run", []), ("none", ["--tools", "none"]), ("turns", ["--max-turns", "2"])):
        assert main([*base, "--out", str(tmp_path / name), *extra]) == 0
        info[name] = json.loads((tmp_path / name / "metrics.json").read_text())["info"]
    assert (info["run"]["tools"]["tools"], info["run"]["tools"]["max_turns"]) == (["zoom_in"], 3)
    assert "tools" not in info["none"]
    assert (info["turns"]["tools"]["tools"], info["turns"]["tools"]["max_turns"]) == (["zoom_in"], 2)
