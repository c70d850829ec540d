"""V* Bench (`--suite vstar`) on a tiny folder in the published layout (craigwu/vstar_bench: direct_attributes/ and
relative_position/, each `<name>.jpg` with `<name>.json` {"target_object", "bbox": [[x, y, w, h]], "question",
"options": correct first}, as penghao-wu/vstar's vstar_bench_eval.py reads them): the loader, the option rotation,
accuracy by category with a scripted engine, and `vlgrpo eval --suite vstar` on the tiny model."""

from __future__ import annotations

import json

import pytest
from PIL import Image
from test_reasoning_scoring import ScriptedEngine

from vlgrpo.cli import main
from vlgrpo.data.schema import DataError
from vlgrpo.evals.reasoning.files import benchmark_of
from vlgrpo.evals.reasoning.loaders import load_benchmark, load_vstar, vstar_rotation
from vlgrpo.evals.run import build_eval_data, evaluate, write_outputs
from vlgrpo.evals.vstar import vstar_choice
from vlgrpo.rewards import RewardContext

ROWS = {
    "direct_attributes": {
        "sa_1": ("What is the color of the glove?", ["red", "blue", "green", "white"], [[3, 4, 10, 8]]),
        "sa_2": ("What is the material of the bag?", ["leather", "cotton", "plastic", "paper"], [[20, 10, 6, 6]]),
        "sa_3": ("What is the color of the cup?", ["yellow", "black", "pink", "gray"], [[40, 30, 5, 4]]),
    },
    "relative_position": {
        "sa_4": (
            "Is the dog on the left or right side of the bench?",
            ["The dog is on the left side of the bench.", "The dog is on the right side of the bench."],
            [[2, 2, 8, 8], [30, 20, 20, 10]],
        ),
        "sa_5": (
            "Is the lamp on the left or right side of the sofa?",
            ["The lamp is on the right side of the sofa.", "The lamp is on the left side of the sofa."],
            [[50, 5, 4, 9], [10, 25, 30, 12]],
        ),
    },
}
"""Two categories as V* publishes them; the correct option is the first. The rotation puts it at B, D, B | B, A."""
GOLD = {"sa_1": "B", "sa_2": "D", "sa_3": "B", "sa_4": "B", "sa_5": "A"}


def vstar_folder(root):
    for category, rows in ROWS.items():
        (root / category).mkdir(parents=True)
        for name, (question, options, boxes) in rows.items():
            Image.new("RGB", (64, 48), (120, 160, 200)).save(root / category / f"{name}.jpg")
            objects = ["glove"] * len(boxes)
            annotation = {"target_object": objects, "bbox": boxes, "question": question, "options": options}
            (root / category / f"{name}.json").write_text(json.dumps(annotation, indent=4))
    return root


def test_the_published_folders_read_as_choice_samples_with_the_correct_option_rotated(tmp_path):
    root = vstar_folder(tmp_path / "vstar_bench")
    assert benchmark_of(root) == "vstar" and benchmark_of(root / "relative_position") == "vstar"
    assert benchmark_of(tmp_path) is None  # the folder above holds no category folder
    samples = load_benchmark(root)
    assert [s.id for s in samples] == [f"vstar-{c}-{n}" for c, rows in ROWS.items() for n in rows]
    by_name = {s.id.rsplit("-", 1)[1]: s for s in samples}
    assert {n: s.answer for n, s in by_name.items()} == GOLD
    glove = by_name["sa_1"]  # rotation 3 of 4: the published order white-last becomes white, red, blue, green
    assert glove.question == "What is the color of the glove?\n(A) white\n(B) red\n(C) blue\n(D) green"
    assert (glove.answer_type, glove.task, glove.boxes) == ("choice", "vstar/direct_attributes", [[3, 4, 13, 12]])
    assert glove.image == str(root / "direct_attributes" / "sa_1.jpg")
    assert glove.meta == {
        "benchmark": "vstar",
        "category": "direct_attributes",
        "options": ["white", "red", "blue", "green"],
        "answer": "red",
        "target_object": ["glove"],
    }
    lamp = by_name["sa_5"]  # rotation 0: the published order kept
    assert lamp.question.endswith(
        "(A) The lamp is on the right side of the sofa.\n(B) The lamp is on the left side of the sofa."
    )
    assert lamp.boxes == [[50, 5, 54, 14], [10, 25, 40, 37]]
    for s in samples:  # the gold letter names the option V* publishes first
        assert s.meta["options"]["ABCD".index(s.answer)] == s.meta["answer"]
    assert [s.id for s in load_vstar(root, split="relative_position")] == [
        "vstar-relative_position-sa_4",
        "vstar-relative_position-sa_5",
    ]
    assert len(load_vstar(root / "direct_attributes")) == 3 and len(load_vstar(root, split="test")) == 5


def test_the_rotation_is_sha256_of_the_name_and_spreads_the_gold_letters():
    assert [vstar_rotation(f"direct_attributes/sa_{i}", 4) for i in (1, 2, 3)] == [3, 1, 3]
    spread = [vstar_rotation(f"direct_attributes/sa_{i}", 4) for i in range(400)]
    assert all(80 <= spread.count(k) <= 120 for k in range(4))  # 100 each, binomial sd 8.7


def test_a_bad_annotation_is_named_with_its_file(tmp_path):
    root = vstar_folder(tmp_path / "v")
    bad = root / "direct_attributes" / "sa_2.json"
    bad.write_text(json.dumps({"question": "Which?", "options": ["only one"]}))
    with pytest.raises(DataError, match=r"sa_2.json, field 'options': must be a list of at least 2 option texts"):
        load_vstar(root)
    bad.write_text(json.dumps({"question": "Which?", "options": ["a", "b"]}))
    (root / "direct_attributes" / "sa_2.jpg").unlink()
    with pytest.raises(DataError, match=r"sa_2.json, field 'image': no image sa_2\{.jpg,"):
        load_vstar(root)
    with pytest.raises(DataError, match="'OCR': use test \\(all\\) or one of direct_attributes, relative_position"):
        load_vstar(root, split="OCR")
    with pytest.raises(DataError, match="is not a V\\* Bench folder: it needs direct_attributes/ and / or"):
        load_vstar(tmp_path)


@pytest.mark.parametrize(
    "read, options, letter",
    [
        ("B", ["red", "white"], "B"),
        ("(B) white", ["red", "white"], "B"),
        ("White.", ["red", "white"], "B"),  # the option's text, case and punctuation aside
        ("the dog is on the LEFT side of the bench", ["The dog is on the left side of the bench.", "x"], "A"),
        ("whitish", ["red", "white"], None),  # not an option's text
        ("A or B", ["red", "white"], None),  # a hedge names no option
        ("red", ["red", "Red"], None),  # two options read the same: neither
        (None, ["red", "white"], None),
    ],
)
def test_an_answer_names_an_option_by_letter_or_by_its_text(read, options, letter):
    assert vstar_choice(read, options) == letter


def test_accuracy_by_category_with_a_scripted_engine(tmp_path):
    root = vstar_folder(tmp_path / "vstar_bench")
    data = build_eval_data(root, "vstar,vqa", ctx=RewardContext())
    assert len(data.vstar) == len(data.vqa) == 5  # vqa scores the same rows by its own choice rule
    answers = {
        "vstar-direct_attributes-sa_1": "<think>the glove is red</think><answer>B</answer>",  # right, by letter
        "vstar-direct_attributes-sa_2": "<answer>leather</answer>",  # right, by the option's text (D)
        "vstar-direct_attributes-sa_3": "<answer>(A) gray</answer>",  # wrong: B is yellow
        "vstar-relative_position-sa_4": "<answer>A</answer>",  # wrong
        "vstar-relative_position-sa_5": "<answer>A</answer>",  # right
    }
    result = evaluate(ScriptedEngine(answers), data, RewardContext(), progress=False)
    vstar = {k: v for k, v in result.metrics.items() if k.startswith("eval/vstar/")}
    assert vstar == {
        "eval/vstar/accuracy": 3 / 5,  # pooled over the questions, as vstar_bench_eval.py prints it
        "eval/vstar/accuracy_direct_attributes": 2 / 3,
        "eval/vstar/accuracy_relative_position": 1 / 2,
    }
    assert result.counts["vstar"] == 5 and result.counts["vstar/direct_attributes"] == 3
    assert result.metrics["eval/vqa/accuracy"] == pytest.approx(2 / 5)  # the option's text is no letter to vqa
    rows = {r["id"]: r for r in result.predictions if r["suite"] == "vstar"}
    bag = rows["vstar-direct_attributes-sa_2"]
    assert (bag["gold"], bag["gold_option"], bag["extracted"], bag["parsed"], bag["correct"]) == (
        "D",
        "leather",
        "leather",
        "D",
        True,
    )
    assert rows["vstar-relative_position-sa_4"]["category"] == "relative_position"
    report = write_outputs(result, tmp_path / "out")["report"].read_text()
    assert "## V* Bench accuracy" in report and "| relative_position | 2 | 0.5000 |" in report
    assert "| direct_attributes | 3 | 0.6667 |" in report


def test_the_suite_reads_the_folder_and_has_nothing_to_say_about_other_data(tmp_path):
    from vlgrpo.evals.source import resolve_source
    from vlgrpo.evals.suite import Selection, load_suite

    suite = load_suite("vstar")
    root = resolve_source(str(vstar_folder(tmp_path / "v")))
    assert (root.kind, root.benchmark) == ("benchmark", "vstar")
    assert len(suite.select(Selection(root, root.load(), max_samples=2))) == 2  # the first two, direct_attributes
    other = resolve_source(str(tmp_path))
    assert suite.select(Selection(other, [])) == []
    assert suite.score([], [], RewardContext(), "pope") == ({}, {"": 0}, [])


def test_cli_eval_suite_vstar_on_the_tiny_model(tiny_model_dir, tmp_path, capsys):
    root = vstar_folder(tmp_path / "vstar_bench")
    out = tmp_path / "eval"
    argv = ["eval", "--model", tiny_model_dir("qwen2_5_vl"), "--suite", "vstar", "--data", str(root), "--out", str(out)]
    assert main([*argv, "--max-new-tokens", "4", "--no-progress"]) == 0
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["counts"] == {"vstar": 5, "vstar/direct_attributes": 3, "vstar/relative_position": 2}
    assert set(doc["metrics"]) == {
        "eval/vstar/accuracy",
        "eval/vstar/accuracy_direct_attributes",
        "eval/vstar/accuracy_relative_position",
    }
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"vstar-{c}-{n}" for c, names in ROWS.items() for n in names]
    assert "eval/vstar/accuracy" in capsys.readouterr().out
    assert "## V* Bench accuracy" in (out / "report.md").read_text()
