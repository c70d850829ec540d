import dataclasses
import json
from pathlib import Path

import pytest

from vlgrpo.cli import main
from vlgrpo.demo_report import NOTES_MARK, seed_targets, seeds_markdown, write_seeds_doc

KEYS = ("sft_test_accuracy", "grpo_test_accuracy", "sft_grounding_acc50", "grpo_grounding_acc50", "sft_pope_f1",
        "grpo_pope_f1", "sft_pope_yes_ratio", "grpo_pope_yes_ratio", "steps", "wall_seconds")
PER_KIND = ("count", "colour", "exist")


def test_demo_runs_every_stage_from_the_shipped_base_and_writes_a_checkable_summary(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--n", "120", "--sft-steps", "3", "--grpo-steps", "2",
                 "--eval-samples", "8"]) == 0
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
    from vlgrpo.demo import BASES

    assert (out / "model" / "model.safetensors").read_bytes() == (
        BASES / "shapes-tiny-qwen2_5_vl" / "model.safetensors").read_bytes()
    assert [json.loads(line)["step"] for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    for name in ("report.md", "curves.png", "eval_sft/metrics.json", "eval_grpo/predictions.jsonl",
                 "grpo_model/config.json", "sft/config.yaml"):
        assert (out / name).is_file(), name
    report = (out / "report.md").read_text()
    assert "after SFT" in report and "eval/vqa/accuracy" in report and "KL to the SFT policy" in report
    # `make demo` twice: the second run replaces the first one's stages instead of resuming or refusing them
    # (the from-scratch route this time: a random tiny model, colour and grounding questions on 2-shape scenes)
    assert main(["demo", "--out", str(out), "--base", "init-tiny", "--n", "120", "--sft-steps", "2",
                 "--grpo-steps", "1", "--eval-samples", "6", "--kinds", "colour,ground", "--max-shapes", "2",
                 "--image-size", "56"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == {"sft": 2, "grpo": 1} and summary["base"] == "init-tiny"
    assert "sft_accuracy_count" not in summary and 0.0 <= summary["sft_accuracy_colour"] <= 1.0
    assert 0.0 <= summary["sft_grounding_acc50"] <= 1.0 and 0.0 <= summary["grpo_grounding_acc50"] <= 1.0
    assert "Grounding Acc@0.5: **" in (out / "report.md").read_text()
    assert len((out / "grpo" / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_grounding_sft_phase_trains_on_the_box_questions_alone_and_starts_the_mixed_cold_start(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--base", "init-tiny", "--n", "120", "--ground-sft-steps", "2",
                 "--sft-steps", "1", "--grpo-steps", "1", "--eval-samples", "4", "--kinds", "colour,ground",
                 "--max-shapes", "2", "--image-size", "56"]) == 0
    train = [json.loads(line) for line in (out / "data" / "train.jsonl").read_text().splitlines()]
    ground = [json.loads(line) for line in (out / "data" / "train_ground.jsonl").read_text().splitlines()]
    assert ground == [r for r in train if r["task"] == "shapes/ground"] and 0 < len(ground) < len(train)
    assert [json.loads(line)["step"] for line in (out / "ground_sft" / "metrics.jsonl").read_text().splitlines()] == [
        1, 2]
    assert f"name_or_path: {out / 'ground_model'}" in (out / "sft" / "config.yaml").read_text()
    assert json.loads((out / "summary.json").read_text())["steps"] == {"ground_sft": 2, "sft": 1, "grpo": 1}


@pytest.mark.parametrize("args, message", [
    (["--ground-sft-steps", "2", "--kinds", "colour,count"], "needs the ground kind in --kinds (given: colour,count)"),
    (["--ground-sft-steps", "-1"], "--ground-sft-steps -1: accepted 0 (none) or more steps"),
])
def test_a_grounding_sft_phase_without_box_questions_or_with_negative_steps_is_refused(tmp_path, capsys, args,
                                                                                       message):
    assert main(["demo", "--out", str(tmp_path / "d"), *args]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "d").exists()


def test_an_unknown_base_is_named_with_what_is_accepted(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "d"), "--base", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "--base 'no-such-model'" in err and "init-tiny" in err and "shapes-tiny-qwen2_5_vl" in err


def test_the_from_scratch_route_builds_trains_and_evaluates_a_qwen3_vl(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--base", "init-tiny", "--arch", "qwen3_vl", "--n", "120", "--sft-steps",
                 "2", "--grpo-steps", "1", "--eval-samples", "6", "--kinds", "colour,ground", "--max-shapes", "2",
                 "--image-size", "64"]) == 0
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
    import vlgrpo.demo as demo
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


def _summary(seed: int, vqa: tuple, ground: tuple, kinds: dict, f1: tuple, yes: float, entropy: float,
             lengths: tuple, wall: float) -> dict:
    return {"seed": seed, "base": "b", "kinds": ["count", "colour", "exist", "ground"], "steps": {"sft": 1, "grpo": 2},
            "collapse_window": 50, "sft_test_accuracy": vqa[0], "grpo_test_accuracy": vqa[1],
            "sft_grounding_acc50": ground[0], "grpo_grounding_acc50": ground[1], "sft_pope_f1": f1[0],
            "grpo_pope_f1": f1[1], "sft_pope_yes_ratio": 0.9, "grpo_pope_yes_ratio": yes,
            **{f"{st}_accuracy_{k}": v[i] for k, v in kinds.items() for i, st in enumerate(("sft", "grpo"))},
            "final_grpo_entropy": entropy, "initial_response_length": lengths[0], "final_response_length": lengths[1],
            "wall_seconds": wall}  # fmt: skip


def test_seed_targets_are_judged_on_hand_computed_lifts(tmp_path):
    kinds_ok = {"count": (0.5, 0.7), "colour": (0.5, 0.6), "exist": (0.5, 0.49)}
    runs = {
        0: _summary(0, (0.50, 0.70), (0.10, 0.30), kinds_ok, (0.6, 0.8), 0.50, 0.30, (10.0, 12.0), 500),
        1: _summary(1, (0.50, 0.56), (0.10, 0.16), kinds_ok, (0.6, 0.7), 0.64, 0.20, (10.0, 19.0), 590),
    }
    got = {t: (ok, m) for t, ok, m in seed_targets(runs)}
    # VQA lifts +20 and +6 points: mean +13 >= 10, every seed >= 5
    assert got["VQA accuracy: mean lift >= +10 points"] == (True, "+13.0")
    assert got["VQA accuracy: every seed >= +5 points"] == (True, "+20.0 / +6.0")
    assert got["VQA accuracy: no kind's mean lift below -2 points"] == (True, "count +20.0, colour +10.0, exist -1.0")
    assert got["grounding Acc@0.5: mean lift >= +10 points"] == (True, "+13.0")
    assert got["POPE F1 after GRPO >= after SFT (mean)"] == (True, "0.600 -> 0.750")
    assert got["response length within 2x of the SFT policy's"] == (True, "1.20x / 1.90x")
    assert all(ok for ok, _ in got.values())
    # one seed misses: VQA +4 points, grounding +4, yes-ratio 0.70, entropy 0.04, length 2.5x, 610 s, exist -3
    bad_kinds = {"count": (0.5, 0.5), "colour": (0.5, 0.5), "exist": (0.5, 0.45)}
    runs[1] = _summary(1, (0.50, 0.54), (0.10, 0.14), bad_kinds, (0.6, 0.3), 0.70, 0.04, (10.0, 25.0), 610)
    got = {t: (ok, m) for t, ok, m in seed_targets(runs)}
    assert got["VQA accuracy: every seed >= +5 points"] == (False, "+20.0 / +4.0")
    assert got["VQA accuracy: no kind's mean lift below -2 points"][0] is False  # exist: (-1 - 5) / 2 = -3
    assert got["VQA accuracy: no kind's mean lift below -2 points"][1].endswith("exist -3.0")
    assert got["grounding Acc@0.5: every seed >= +5 points"] == (False, "+20.0 / +4.0")
    assert got["POPE F1 after GRPO >= after SFT (mean)"] == (False, "0.600 -> 0.550")
    for target in ("POPE yes-ratio after GRPO in [0.35, 0.65] on every seed", "entropy > 0.05 over the last GRPO "
                   "steps", "response length within 2x of the SFT policy's", "wall_seconds <= 600"):
        assert got[target][0] is False, target
    # the document: one row per seed, the means, the targets table
    for seed, s in runs.items():
        (tmp_path / f"seed{seed}").mkdir()
        (tmp_path / f"seed{seed}" / "summary.json").write_text(json.dumps(s))
    doc = write_seeds_doc(tmp_path, tmp_path / "seeds.md").read_text()
    assert doc == seeds_markdown(runs, "dev/demo_seeds.sh")  # no eval directories: answered is n/a
    assert "| 1 | 0.500 → 0.540 (+4.0) |" in doc and "| mean | 0.500 → 0.620 (+12.0) |" in doc
    assert ", 1 SFT steps then 2 GRPO steps;" in doc and "box questions alone" not in doc
    with_ground = {seed: {**s, "steps": {"ground_sft": 120, **s["steps"]}} for seed, s in runs.items()}
    assert ", 120 SFT steps on the box questions alone, 1 SFT steps then 2 GRPO steps;" in seeds_markdown(
        with_ground, "dev/demo_seeds.sh")
    # the answered share comes from each stage's eval info: seed 0 read 990 of 1,000 answers after SFT, all after
    for stage, missing in (("sft", 10), ("grpo", 0)):
        (tmp_path / "seed0" / f"eval_{stage}").mkdir()
        (tmp_path / "seed0" / f"eval_{stage}" / "metrics.json").write_text(json.dumps(
            {"metrics": {}, "info": {"samples": 1000, "no_answer": missing}}))
    doc = write_seeds_doc(tmp_path, tmp_path / "seeds.md").read_text()
    assert "| 0.900 → 0.500 (-40.0) | 0.990 → 1.000 (+1.0) | 0.300 |" in doc  # yes-ratio, answered, entropy
    assert "| 0.900 → 0.700 (-20.0) | n/a | 0.040 |" in doc  # seed 1 has no eval directories
    assert "| wall_seconds <= 600 | **no** | 500 / 610 |" in doc
    # hand-written notes below the mark survive a regeneration; text above it is the generated table's
    notes = f"{NOTES_MARK}\n\n## How these ran\n\nby hand\n"
    (tmp_path / "seeds.md").write_text("stale table\n" + notes)
    doc = write_seeds_doc(tmp_path, tmp_path / "seeds.md").read_text()
    assert doc.endswith("\n" + notes) and "stale table" not in doc and doc.count(NOTES_MARK) == 1
    assert doc.startswith(seeds_markdown({0: runs[0], 1: runs[1]}, "dev/demo_seeds.sh")[:200])


def test_the_seed_table_needs_runs(tmp_path):
    with pytest.raises(FileNotFoundError, match="dev/demo_seeds.sh"):
        write_seeds_doc(tmp_path, tmp_path / "x.md")
