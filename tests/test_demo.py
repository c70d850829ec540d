import dataclasses
import json
from pathlib import Path

from vlgrpo.cli import main

KEYS = (
    "sft_test_accuracy",
    "grpo_test_accuracy",
    "sft_grounding_acc50",
    "grpo_grounding_acc50",
    "sft_pope_f1",
    "grpo_pope_f1",
    "sft_pope_yes_ratio",
    "grpo_pope_yes_ratio",
    "steps",
    "wall_seconds",
)
PER_KIND = ("count", "colour", "exist")


def _from_scratch_demo(out, *extra: str, image_size: int) -> list[str]:
    """A 1-SFT-step, 1-GRPO-step demo from a random tiny model: colour and grounding questions on 2-shape scenes."""
    flags = (
        "--base init-tiny --n 120 --sft-steps 2 --grpo-steps 1 --eval-samples 6 --kinds colour,ground --max-shapes 2"
    )
    return ["demo", "--out", str(out), *flags.split(), *extra, "--image-size", str(image_size)]


def test_demo_runs_every_stage_from_the_shipped_base_and_writes_a_checkable_summary(tmp_path):
    out = tmp_path / "demo"
    assert (
        main(["demo", "--out", str(out), "--n", "120", "--sft-steps", "3", "--grpo-steps", "2", "--eval-samples", "8"])
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    for key in KEYS:
        assert key in summary, key
    for key in ("sft_test_accuracy", "grpo_test_accuracy", "sft_grounding_acc50", "grpo_pope_yes_ratio"):
        assert 0.0 <= summary[key] <= 1.0, key
    assert summary["kinds"] == ["count", "colour", "exist", "ground"] and summary["base"] == "shapes-tiny-qwen2_5_vl"
    for stage in ("sft", "grpo"):  # the per-kind accuracies are the eval's own per-task figures
        for kind in PER_KIND:
            assert summary[f"{stage}_accuracy_{kind}"] == summary[stage][f"eval/vqa/accuracy_task_shapes/{kind}"]
    assert summary["steps"] == {"sft": 3, "grpo": 2} and summary["collapse_window"] == 2
    # the shipped base is what the demo starts from (copied, not rebuilt): its weights are byte-identical
    from vlgrpo.demo.run import BASES

    assert (out / "model" / "model.safetensors").read_bytes() == (
        BASES / "shapes-tiny-qwen2_5_vl" / "model.safetensors"
    ).read_bytes()
    assert [json.loads(line)["step"] for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    for name in (
        "report.md",
        "curves.png",
        "eval_sft/metrics.json",
        "eval_grpo/predictions.jsonl",
        "grpo_model/config.json",
        "sft/config.yaml",
    ):
        assert (out / name).is_file(), name
    report = (out / "report.md").read_text()
    assert "after SFT" in report and "eval/vqa/accuracy" in report and "KL to the SFT policy" in report
    # `make demo` twice: the second run replaces the first one's stages instead of resuming or refusing them
    # (the from-scratch route this time: a random tiny model, colour and grounding questions on 2-shape scenes)
    assert main(_from_scratch_demo(out, image_size=56)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == {"sft": 2, "grpo": 1} and summary["base"] == "init-tiny"
    assert "sft_accuracy_count" not in summary and 0.0 <= summary["sft_accuracy_colour"] <= 1.0
    assert 0.0 <= summary["sft_grounding_acc50"] <= 1.0 and 0.0 <= summary["grpo_grounding_acc50"] <= 1.0
    assert "Grounding Acc@0.5: **" in (out / "report.md").read_text()
    assert len((out / "grpo" / "metrics.jsonl").read_text().splitlines()) == 1


def test_an_unknown_base_is_named_with_what_is_accepted(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "d"), "--base", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "--base 'no-such-model'" in err and "init-tiny" in err and "shapes-tiny-qwen2_5_vl" in err


def test_the_from_scratch_route_builds_trains_and_evaluates_a_qwen3_vl(tmp_path):
    out = tmp_path / "demo"
    assert main(_from_scratch_demo(out, "--arch", "qwen3_vl", image_size=64)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["arch"] == "qwen3_vl" and summary["steps"] == {"sft": 2, "grpo": 1}
    assert 0.0 <= summary["grpo_accuracy_colour"] <= 1.0 and 0.0 <= summary["grpo_grounding_acc50"] <= 1.0
    for stage in ("model", "sft_model", "grpo_model"):  # built with DeepStack, trained and exported as Qwen3-VL
        config = json.loads((out / stage / "config.json").read_text())
        assert config["architectures"] == ["Qwen3VLForConditionalGeneration"], stage
        assert config["vision_config"]["deepstack_visual_indexes"] == [0, 1], stage
    contract = json.loads((out / "grpo_model" / "vlgrpo.json").read_text())
    assert (contract["arch"], contract["box_format"]) == ("qwen3_vl", "qwen3")  # 0-1000 boxes in SFT, reward, eval


def test_an_arch_other_than_the_bases_is_refused_before_anything_is_written(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "d"), "--arch", "qwen3_vl"]) == 2  # the shipped base: Qwen2.5-VL
    err = capsys.readouterr().err
    assert "--arch qwen3_vl with --base shapes-tiny-qwen2_5_vl: that base is a qwen2_5_vl model" in err
    assert "--base init-tiny" in err and not (tmp_path / "d").exists()


def test_compare_and_motion_kinds_select_vqa_and_write_two_image_and_video_rows(tmp_path, monkeypatch, capsys):
    """`vlgrpo demo --from-scratch --kinds compare,motion` without training: its settings, the stage configs (the VQA
    suite, frames at the image size), and the data it writes (two images a compare row, a frame list a motion row),
    read back as training reads it; the random model's merger is calibrated on every image and frame."""
    import vlgrpo.demo.run as demo
    from vlgrpo.data.adapters import load_samples
    from vlgrpo.data.images import DEFAULT_GEOMETRY
    from vlgrpo.data.video import VideoSampling

    seen = []
    monkeypatch.setattr(demo, "run_demo", lambda out, settings: seen.append(settings))
    assert main(["demo", "--out", str(tmp_path / "d"), "--from-scratch", "--kinds", "compare,motion"]) == 0
    assert seen == [demo.from_scratch(kinds=("compare", "motion"))]
    s = dataclasses.replace(seen[0], n_samples=40)
    assert demo.demo_suites(s.kinds) == ["vqa"]  # no one-image scenes to probe: no POPE, no grounding
    assert demo.demo_suites(("count", "compare")) == ["vqa", "pope"]
    grpo = demo.stage_config(s, tmp_path, "grpo", tmp_path / "sft_model")
    assert grpo.eval.suites == ["vqa"] and "iou" not in grpo.reward.recipe
    for cfg in (grpo, demo.stage_config(s, tmp_path, "sft", tmp_path / "model")):
        # a 56 px frame stays 56 px: 2 x 2 tokens, as the scenes' images (not 128 tokens' worth)
        assert VideoSampling.from_config(cfg.data.video).pixel_bounds(DEFAULT_GEOMETRY) == (56 * 56, 56 * 56)
    capsys.readouterr()
    model_dir, paths = demo.build_model_and_data(s, tmp_path, demo.resolve_base(s.base))
    assert "merger calibrated on 96 training images" in capsys.readouterr().out  # 16 compare x 2 + 16 motion x 4
    samples = load_samples(paths["train"]).samples
    compare = [x for x in samples if x.task == "shapes/compare"]
    motion = [x for x in samples if x.task == "shapes/motion"]
    assert len(compare) == len(motion) == 16 and len(samples) == 32
    assert all(len(x.images) == 2 and x.video is None and x.answer in ("first", "second") for x in compare)
    assert all(x.images == [] and len(x.video.frames) == 4 and x.answer in ("left", "right") for x in motion)
    assert {x.answer_type for x in samples} == {"text"}
    for x in compare + motion:
        for f in [*x.images, *x.video.frames] if x.video else x.images:
            assert Path(f).is_file(), f
