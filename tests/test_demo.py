import json

from vlgrpo.cli import main

KEYS = ("sft_test_accuracy", "grpo_test_accuracy", "sft_grounding_acc50", "grpo_grounding_acc50", "steps",
        "wall_seconds")


def test_demo_runs_every_stage_and_writes_a_checkable_summary(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--n", "120", "--sft-steps", "3", "--grpo-steps", "2",
                 "--eval-samples", "6"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in KEYS:
        assert key in summary, key
    for key in KEYS[:2]:
        assert 0.0 <= summary[key] <= 1.0
    assert summary["kinds"] == ["colour"]  # the default: no grounding questions, so grounding is not evaluated
    assert summary["sft_grounding_acc50"] is None and summary["grpo_grounding_acc50"] is None
    assert summary["steps"] == {"sft": 3, "grpo": 2}
    assert [json.loads(line)["step"] for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    for name in ("report.md", "curves.png", "eval_sft/metrics.json", "eval_grpo/predictions.jsonl",
                 "grpo_model/config.json", "sft/config.yaml"):
        assert (out / name).is_file(), name
    report = (out / "report.md").read_text()
    assert "after SFT" in report and "eval/vqa/accuracy" in report and "KL to the SFT policy" in report
    # `make demo` twice: the second run replaces the first one's stages instead of resuming or refusing them
    # (with grounding questions and 2-shape scenes this time: Acc@0.5 is measured, POPE asks 2 + 2 per image)
    assert main(["demo", "--out", str(out), "--n", "120", "--sft-steps", "2", "--grpo-steps", "1",
                 "--eval-samples", "6", "--kinds", "colour,ground", "--max-shapes", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == {"sft": 2, "grpo": 1}
    assert 0.0 <= summary["sft_grounding_acc50"] <= 1.0 and 0.0 <= summary["grpo_grounding_acc50"] <= 1.0
    assert "Grounding Acc@0.5: **" in (out / "report.md").read_text()
    assert len((out / "grpo" / "metrics.jsonl").read_text().splitlines()) == 1
