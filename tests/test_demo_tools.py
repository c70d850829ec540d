"""`vlgrpo demo --tools`: both arms run every stage from the shipped base and the report sets them side by side; the
share of crops holding the asked-about shape is counted as the zoom tool reads a box."""

import json

from vlgrpo.cli import main
from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.demo.tools import crop_hits
from vlgrpo.types import Sample

CALL = '<tool_call>{{"name": "image_zoom_in_tool", "arguments": {{"bbox_2d": {}}}}}</tool_call>'


def test_crop_hits_reads_each_completions_first_call_as_the_zoom_tool_crops_it():
    geometry = ProcessorGeometry(max_pixels=224 * 224)  # the tiny base's: 896 px -> 224 px, boxes x4 to the original
    target = Sample(
        id="a", image="a.png", question="q", answer="red", image_size=(896, 896), meta={"target": [230, 10, 244, 24]}
    )
    texts = [
        CALL.format("[56, 0, 112, 56]") + "<answer>red</answer>",  # crops (224, 0, 448, 224): holds it
        CALL.format("[0, 0, 56, 56]"),  # crops (0, 0, 224, 224): misses it (x 230 > 224)
        CALL.format("[57, 0, 112, 56]"),  # crops (228, 0, 448, 224): holds it
        CALL.format("[60, 3, 112, 56]"),  # crops (240, 12, ...): cuts it
        '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2]}}</tool_call>',  # no crop
        "<answer>red</answer>",  # no call
    ]
    assert crop_hits([target] * len(texts), texts, "qwen2_5", geometry) == (2, 4)
    assert crop_hits([target], [CALL.format("[224, 0, 448, 224]")], "plain", geometry) == (1, 1)  # pixels as is


def test_the_tool_demo_runs_both_arms_and_reports_them_side_by_side(tmp_path):
    out = tmp_path / "tools"
    args = ["demo", "--tools", "--out", str(out), "--n", "40", "--sft-steps", "2", "--grpo-steps", "1"]
    assert main([*args, "--eval-samples", "3"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for arm in ("tool", "plain"):
        for stage in ("sft", "grpo"):
            assert 0.0 <= summary[f"{arm}_{stage}"]["accuracy"] <= 1.0
        assert (out / arm / "eval_grpo" / "predictions.jsonl").is_file()
    for key in ("calls_per_sample", "crop_hits", "errors", "crop_area"):
        assert key in summary["tool_grpo"] and key not in summary["plain_grpo"]
    report = (out / "report.md").read_text()
    assert "| test accuracy |" in report and "tool arm, GRPO" in report and "plain arm, SFT" in report
    tool_cfg = (out / "tool" / "grpo" / "config.yaml").read_text()
    assert "zoom_in" in tool_cfg and "zoom_in" not in (out / "plain" / "grpo" / "config.yaml").read_text()


def test_the_tool_demo_refuses_the_flags_of_the_shapes_demo(tmp_path, capsys):
    assert main(["demo", "--tools", "--out", str(tmp_path / "x"), "--kinds", "count", "--image-size", "56"]) == 2
    assert "it does not take --kinds, --image-size" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
