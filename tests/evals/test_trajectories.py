"""`vlgrpo eval` with tools: a multi-turn row's conversation in predictions.jsonl (the Hugging Face chat format, the
crop saved next to it and named by its image part), a trajectory section in report.md, the tools' counters in
metrics.json; and `--tools` on the command line end to end."""

from __future__ import annotations

import json

from PIL import Image

from vlgrpo.cli import main
from vlgrpo.data.adapters import load_samples
from vlgrpo.data.prompts import instruction
from vlgrpo.evals.run import EvalData, evaluate, write_outputs
from vlgrpo.rewards import RewardContext
from vlgrpo.rollout.hf import HFEngine
from vlgrpo.rollout.sampling import Row
from vlgrpo.rollout.turns import ToolRollout
from vlgrpo.vision_cache import VisionCache

CALL = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 40, 30]}}</tool_call>'
OPEN, CLOSE = {"type": "text", "text": "<tool_response>\n"}, {"type": "text", "text": "\n</tool_response>"}


def test_a_trajectory_is_written_as_messages_with_its_crop(load, shapes_dir, tmp_path):
    model, processor = load("qwen2_5_vl")
    sample = next(s for s in load_samples(shapes_dir / "test.jsonl").samples if s.answer_type == "number")
    texts = [CALL, f"<answer>{sample.answer}</answer>"]

    def scripted(model_, last, cache, next_pos, mask, run):
        ids = processor.tokenizer(texts.pop(0), add_special_tokens=False)["input_ids"]
        return [Row(list(ids), [0.0] * len(ids), "stop") for _ in range(last.shape[0])]

    engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain", decode=scripted)
    result = evaluate(ToolRollout(engine, ("zoom_in",), 3), EvalData(vqa=[sample]), RewardContext(), progress=False)
    assert result.metrics["eval/vqa/accuracy"] == 1.0  # the answer of the second turn is read
    write_outputs(result, tmp_path)
    (row,) = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    # the prompt as the model saw it: the tools block in the system turn (the tiny template ignores tools=), the
    # question with its instruction; the crop back as the user <tool_response> turn the model read
    system, user, assistant, tool, answer = row["messages"]
    assert system["role"] == "system" and "image_zoom_in_tool" in system["content"]
    question = f"{sample.question} {instruction(sample.answer_type, 'think_answer', 'plain')}"
    assert user["content"] == [{"type": "image", "image": sample.image}, {"type": "text", "text": question}]
    assert assistant == {"role": "assistant", "content": [{"type": "text", "text": CALL}]}
    crop = {"type": "image", "image": f"crops/{sample.id}_0.png"}
    assert tool == {"role": "user", "content": [OPEN, crop, CLOSE]}
    assert answer["content"][0]["text"] == f"<answer>{sample.answer}</answer>"
    assert Image.open(tmp_path / "crops" / f"{sample.id}_0.png").size == (40, 30)
    report = (tmp_path / "report.md").read_text()
    assert "## Trajectories with tool calls" in report and f"![image](crops/{sample.id}_0.png)" in report


def test_cli_eval_with_tools(tiny_model_dir, shapes_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["eval", "--model", tiny_model_dir("qwen2_5_vl"), "--suite", "vqa", "--data", str(shapes_dir / "test.jsonl")]
    argv += ["--out", str(out), "--max-new-tokens", "4", "--no-progress", "--tools", "zoom_in", "--max-turns", "2"]
    assert main(argv) == 0
    info = json.loads((out / "metrics.json").read_text())["info"]
    assert info["tools"]["tools"] == ["zoom_in"] and info["tools"]["max_turns"] == 2
    assert info["tools"]["tools/turns"] >= 1
    assert main([*argv[:-4], "--tools", "no_such_tool"]) == 2
    assert "no_such_tool" in capsys.readouterr().err  # (--engine vllm with tools runs: tests/evals/test_vllm_eval.py)
