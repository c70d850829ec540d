"""`vlgrpo reward` on real shapes samples: components, weighted total, recipes, JSON output and clear errors."""

import json

import pytest

from vlgrpo.cli import main


def _rows(shapes_dir):
    return [json.loads(line) for line in (shapes_dir / "train.jsonl").read_text().splitlines()]


def _first(shapes_dir, answer_type):
    return next(r for r in _rows(shapes_dir) if r["answer_type"] == answer_type)


def _run(capsys, *argv):
    code = main(["reward", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_count_sample_default_recipe(shapes_dir, capsys):
    row = _first(shapes_dir, "number")
    completion = f"<think>I count them.</think><answer>{row['answer']}</answer>"
    code, out, _ = _run(
        capsys, "--sample", str(shapes_dir / "train.jsonl"), "--id", row["id"], "--completion", completion, "--json"
    )
    report = json.loads(out)
    assert code == 0
    assert report["components"] == {"accuracy": 1.0, "format": 1.0}
    assert report["weights"] == {"accuracy": 1.0, "format": 0.5} and report["total"] == 1.5
    assert report["extracted_answer"] == row["answer"] and report["failures"] == []


def test_grounding_sample_box_conventions(shapes_dir, capsys):
    """Shapes images are 112 x 112, which smart_resize leaves unchanged: Qwen2.5-VL pixels = original pixels;
    Qwen2-VL writes the same box on 0-1000."""
    row = _first(shapes_dir, "box")
    x1, y1, x2, y2 = row["boxes"][0]
    jsonl = str(shapes_dir / "train.jsonl")
    qwen25 = f'<think>there</think><answer>[{{"bbox_2d": [{x1}, {y1}, {x2}, {y2}], "label": "it"}}]</answer>'
    code, out, _ = _run(capsys, "--sample", jsonl, "--id", row["id"], "--completion", qwen25, "--json")
    report = json.loads(out)
    assert code == 0 and report["components"] == {"iou": 1.0, "format": 1.0} and report["total"] == 1.5
    assert report["predicted_boxes"] == [[float(v) for v in row["boxes"][0]]]
    norm = [round(v * 1000 / 112, 3) for v in (x1, y1, x2, y2)]
    qwen2 = f"<think>t</think><answer><|box_start|>({norm[0]},{norm[1]}),({norm[2]},{norm[3]})<|box_end|></answer>"
    code, out, _ = _run(
        capsys,
        "--sample",
        jsonl,
        "--id",
        row["id"],
        "--completion",
        qwen2,
        "--box-format",
        "qwen2",
        "--recipe",
        "{iou@0.9: 2.0}",
        "--json",
    )
    report = json.loads(out)
    assert report["components"] == {"iou@0.9": 1.0} and report["total"] == 2.0


def test_text_report_and_recipe_forms(shapes_dir, capsys, tmp_path):
    row = _first(shapes_dir, "text")
    sample = json.dumps(row)  # a JSON row instead of a file
    code, out, _ = _run(capsys, "--sample", sample, "--completion", "It is probably blue.", "--recipe", "accuracy")
    assert code == 0
    assert "extracted answer: 'It is probably blue.'" in out and "format (think_answer): FAILED" in out
    assert out.splitlines()[-1].split() == ["total", "0.0000"]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("accuracy: 2.0\nformat: 1.0\n")
    completion = f"<answer>{row['answer'].upper()}</answer>"
    code, out, _ = _run(
        capsys, "--sample", sample, "--completion", completion, "--recipe", str(recipe), "--answer-format", "answer"
    )
    assert [line.split() for line in out.splitlines()[-3:]] == [
        ["accuracy", "1.0000", "2", "2.0000"],
        ["format", "1.0000", "1", "1.0000"],
        ["total", "3.0000"],
    ]
    config = tmp_path / "run.yaml"
    config.write_text("reward:\n  recipe: {accuracy: 1.0}\n  gate_accuracy_on_format: true\n")
    code, out, _ = _run(capsys, "--sample", sample, "--completion", row["answer"], "--recipe", str(config), "--json")
    assert json.loads(out)["components"] == {"accuracy": 0.0}  # right answer, gated off by the missing format


def test_failures_and_bad_input_are_reported(shapes_dir, capsys, tmp_path):
    row = dict(_first(shapes_dir, "box"), image_size=None, image="missing.png")
    code, out, _ = _run(capsys, "--sample", json.dumps(row), "--completion", "[1, 2, 3, 4]")
    assert code == 1 and "FAILED iou: ValueError" in out and f"sample '{row['id']}' has no image_size" in out
    code, _, err = _run(capsys, "--sample", str(shapes_dir / "train.jsonl"), "--completion", "x", "--recipe", "acc")
    assert code == 2 and "unknown reward 'acc'" in err
    code, _, err = _run(capsys, "--sample", str(shapes_dir / "train.jsonl"), "--index", "999", "--completion", "x")
    assert code == 2 and "--index 999 is out of range" in err
    code, _, err = _run(capsys, "--sample", "{not json", "--completion", "x")
    assert code == 2 and "--sample is not valid JSON" in err
    code, _, err = _run(capsys, "--sample", str(shapes_dir / "train.jsonl"), "--completion", f"@{tmp_path}/none.txt")
    assert code == 2 and "does not exist" in err


def test_completion_from_file(shapes_dir, capsys, tmp_path):
    row = _first(shapes_dir, "yesno")
    path = tmp_path / "completion.txt"
    path.write_text(f"<think>looked\ncarefully</think>\n<answer>{row['answer'].capitalize()}.</answer>\n")
    code, out, _ = _run(capsys, "--sample", json.dumps(row), "--completion", f"@{path}", "--json")
    assert code == 0 and json.loads(out)["total"] == pytest.approx(1.5)


def test_without_a_config_boxes_use_the_released_processor_geometry(capsys):
    """A 1920 x 1080 image is resized to 1932 x 1092 by the released Qwen2.5-VL processors (round(1920/28) = 69,
    round(1080/28) = 39 patches of 28): the gold [480, 270, 1440, 810] written in that space is
    [483, 273, 1449, 819]."""
    row = {
        "id": "hd",
        "question": "Where is the car?",
        "answer_type": "box",
        "boxes": [[480, 270, 1440, 810]],
        "image": "car.png",
        "image_size": [1920, 1080],
    }
    completion = '<think>t</think><answer>[{"bbox_2d": [483, 273, 1449, 819], "label": "car"}]</answer>'
    code, out, _ = _run(capsys, "--sample", json.dumps(row), "--completion", completion, "--json")
    report = json.loads(out)
    assert code == 0 and report["predicted_boxes"] == [[480.0, 270.0, 1440.0, 810.0]]
    assert report["components"] == {"iou": 1.0, "format": 1.0}
