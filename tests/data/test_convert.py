"""`vlgrpo data convert` through the CLI, then the converted file as the doctor and the loader read it: box rows carry
their image size, image paths are relative (the folder moves), generated ids differ between files, and a missing image
is listed by row and path with exit status 1."""

import base64
import io
import json
import shutil
from pathlib import Path

from PIL import Image

from vlgrpo.cli import main
from vlgrpo.data.adapters import load_samples

BOX_QUESTION = "<image>\nPlease provide the bounding box coordinate of the region this sentence describes: the square."


def _image(path: Path, size: tuple[int, int], colour=(200, 30, 30)) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, format="PNG")
    return path.read_bytes()


def _llava(image: str, question: str, answer: str, **extra) -> dict:
    return {
        "image": image,
        "conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}],
        **extra,
    }


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=2))  # a JSON array, as LLaVA and VLM-R1 ship theirs
    return path


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _convert(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(["data", "convert", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_a_pixel_box_row_gets_the_image_size_and_passes_the_doctor(tmp_path, capsys):
    _image(tmp_path / "src/img/a.png", (200, 150))  # not square: a swapped (height, width) would show
    src = _write(tmp_path / "src/refs.json", [_llava("img/a.png", BOX_QUESTION, "[100, 50, 180, 130]", id="r1")])
    out = tmp_path / "out/refs.jsonl"
    rc, summary = _convert(capsys, str(src), "--preset", "llava", "--out", str(out))
    assert rc == 0 and summary["box_conventions"] == {"original-image pixels": 1}
    (row,) = _rows(out)
    assert row["boxes"] == [[100.0, 50.0, 180.0, 130.0]] and row["image_size"] == [200, 150]
    # the qwen2_5 box reward converts with image_size: without it the doctor reported gold_unparseable
    assert main(["data", "doctor", str(out), "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == 0 and report["checks"] == {}


def test_converted_image_paths_are_relative_and_the_folder_moves(tmp_path, capsys, monkeypatch):
    project = tmp_path / "laptop/project"
    photo = _image(project / "images/a.png", (64, 48), (10, 200, 10))
    llava = _write(project / "raw/llava.json", [_llava("a.png", "<image>\nIs it green?", "Yes")])
    embedded = io.BytesIO()
    Image.new("RGB", (32, 16), (0, 0, 250)).save(embedded, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(embedded.getvalue()).decode()
    chat = project / "raw/chat.jsonl"
    chat.write_text(
        json.dumps(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": url}},
                            {"type": "text", "text": "Is it blue?"},
                        ],
                    },
                    {"role": "assistant", "content": "yes"},
                ]
            }
        )
        + "\n"
    )
    train, val = project / "data/train.jsonl", project / "data/val.jsonl"
    assert (
        _convert(capsys, str(llava), "--preset", "llava", "--image-root", str(project / "images"), "--out", str(train))[
            0
        ]
        == 0
    )
    assert _convert(capsys, str(chat), "--preset", "messages", "--out", str(val))[0] == 0
    assert _rows(train)[0]["image"] == "../images/a.png"  # relative to the output file's directory
    (written,) = (project / "data/val_images").iterdir()  # the embedded image, written once as a file
    assert _rows(val)[0]["image"] == f"val_images/{written.name}"

    shutil.copytree(project, tmp_path / "cluster/project")  # the whole folder, images with it
    shutil.rmtree(tmp_path / "laptop")  # nothing left where the file was converted
    (tmp_path / "cluster/elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "cluster/elsewhere")  # another working directory, and a relative path to the file
    (s,) = load_samples("../project/data/train.jsonl").samples
    assert Path(s.image).resolve() == (tmp_path / "cluster/project/images/a.png").resolve()
    assert Path(s.image).read_bytes() == photo
    (v,) = load_samples("../project/data/val.jsonl").samples
    assert Path(v.image).read_bytes() == embedded.getvalue()


def test_splits_converted_separately_get_disjoint_ids(tmp_path, capsys):
    _image(tmp_path / "src/a.png", (112, 112))
    rows = [
        {"image": "a.png", "problem": f"How many cubes are there? ({i})", "solution": "<answer> 3 </answer>"}
        for i in range(2)
    ]  # R1-V rows carry no id
    for split in ("train", "val"):
        src = _write(tmp_path / f"src/{split}.json", rows)
        assert _convert(capsys, str(src), "--preset", "r1v", "--out", str(tmp_path / f"data/{split}.jsonl"))[0] == 0
    assert [r["id"] for r in _rows(tmp_path / "data/train.jsonl")] == ["train-1", "train-2"]
    assert [r["id"] for r in _rows(tmp_path / "data/val.jsonl")] == ["val-1", "val-2"]
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"data: {{train: {tmp_path / 'data/train.jsonl'}, val: {tmp_path / 'data/val.jsonl'}}}\n")
    assert main(["data", "doctor", str(cfg), "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checks"] == {} and {k: v["samples"] for k, v in report["splits"].items()} == {"train": 2, "val": 2}


def test_a_missing_image_exits_1_listing_each_row_and_path(tmp_path, capsys):
    _image(tmp_path / "src/img/ok.png", (112, 112))
    rows = [_llava("img/ok.png", "<image>\nHow many?", "2")]  # row 1: converted
    rows += [_llava(f"img/gone{i}.png", "<image>\nHow many?", "2") for i in range(2, 13)]  # rows 2-12: no such file
    rows += [_llava("img/lost.png", BOX_QUESTION, "[10, 10, 50, 50]")]  # row 13: a box whose size cannot be read
    src = _write(tmp_path / "src/llava.json", rows)
    out = tmp_path / "out/train.jsonl"
    argv = ["data", "convert", str(src), "--preset", "llava", "--out", str(out)]
    assert main(argv) == 1
    text = capsys.readouterr().out
    assert "rows 13: 1 samples written, 0 skipped, 0 invalid, 12 image missing" in text
    assert f"  image missing, row 2: {tmp_path / 'src/img/gone2.png'}\n" in text
    assert f"row 11: {tmp_path / 'src/img/gone11.png'}\n" in text and "row 12:" not in text  # 10 rows shown
    assert "… 2 more rows with a missing image (--json lists them all)" in text
    assert "12 rows not written (exit status 1): their image file is missing or unreadable" in text
    assert [r["image"] for r in _rows(out)] == ["../src/img/ok.png"]  # the rows it could convert are written

    rc, summary = _convert(capsys, *argv[2:])
    assert rc == 1 and summary["invalid"] == [] and summary["samples"] == 1
    missing = summary["missing_images"]
    assert [(m["row"], Path(m["image"]).name) for m in missing] == [
        *((i, f"gone{i}.png") for i in range(2, 13)),
        (13, "lost.png"),
    ]
    assert missing[0]["problem"] == f"image file '{tmp_path / 'src/img/gone2.png'}' does not exist"
    assert missing[-1]["problem"].startswith("the row declares no image size and it cannot be read from the image")
