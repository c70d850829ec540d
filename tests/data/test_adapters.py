import json
from pathlib import Path

import pytest
from PIL import Image

from vlgrpo.data.adapters import load_samples, write_jsonl
from vlgrpo.data.schema import DataError


def _row(**kw):
    row = {"id": "a", "image": "img.png", "question": "How many?", "answer": "2", "answer_type": "number"}
    row.update(kw)
    return row


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_resolves_images_relative_to_the_file(tmp_path):
    (tmp_path / "sub").mkdir()
    path = _write(tmp_path / "sub" / "d.jsonl", [_row(), _row(id=7, answer=3, image="/abs/x.png")])
    samples = load_samples(path).samples
    assert samples[0].image == str(tmp_path / "sub" / "img.png")
    assert samples[1].id == "7" and samples[1].answer == "3" and samples[1].image == "/abs/x.png"


@pytest.mark.parametrize(
    "row, row_no, field, fragment",
    [
        ('{"id": "a", "image": ', 2, None, "malformed JSON"),
        (_row(answer_type="essay"), 2, "answer_type", "number, choice, yesno, text, box, math"),
        (_row(question=None), 2, "question", "required"),
        (_row(answer_type="box", boxes=[[10, 10, 5, 20]], image_size=[50, 50]), 2, "boxes", "inverted"),
        (_row(answer_type="box", boxes=[[10, 10, 60, 20]], image_size=[50, 50]), 2, "boxes", "outside the 50x50"),
        (_row(answer_type="box", boxes=[[1, 2, 3]]), 2, "boxes", "[x1, y1, x2, y2]"),
        (_row(answer_type="box", boxes=[]), 2, "boxes", "at least one gold box"),
        (_row(answer=None), 2, "answer", "needs a gold answer"),
        (_row(colour="red"), 2, "colour", "unknown field"),
        (_row(image_size=[10]), 2, "image_size", "[width, height]"),
        ("[1, 2]", 2, None, "JSON object"),
    ],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, row, row_no, field, fragment):
    path = _write(tmp_path / "d.jsonl", [_row(), row])
    with pytest.raises(DataError) as e:
        load_samples(path)
    assert e.value.source == str(path) and e.value.row == row_no and e.value.field == field
    assert fragment in str(e.value) and f"row {row_no}" in str(e.value)


def test_skip_mode_reports_every_bad_row_and_keeps_the_rest(tmp_path):
    path = _write(tmp_path / "d.jsonl", [_row(), "not json", _row(id="b"), _row(answer_type="nope"), ""])
    result = load_samples(path, errors="skip")
    assert [s.id for s in result.samples] == ["a", "b"]
    assert [(e.row, e.field) for e in result.errors] == [(2, None), (4, "answer_type")]


def test_hf_saved_parquet_and_in_memory(tmp_path):
    datasets = pytest.importorskip("datasets")
    img = Image.new("RGB", (20, 10), (0, 0, 255))
    rows = [
        _row(
            id="h1",
            image=str(tmp_path / "x.png"),
            answer_type="box",
            answer=None,
            boxes=[[1, 1, 5, 5]],
            image_size=[20, 10],
        )
    ]
    img.save(tmp_path / "x.png")
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "d.parquet"))
    for source in (tmp_path / "saved", tmp_path / "d.parquet", ds):
        (s,) = load_samples(source).samples
        assert s.id == "h1" and s.boxes == [[1.0, 1.0, 5.0, 5.0]] and s.image_size == (20, 10)
    # an Image feature column arrives as a decoded image -> encoded bytes
    with_images = datasets.Dataset.from_dict(
        {"id": ["p"], "image": [img], "question": ["q"], "answer": ["yes"], "answer_type": ["yesno"]}
    ).cast_column("image", datasets.Image())
    (s,) = load_samples(with_images).samples
    assert isinstance(s.image, bytes) and s.image[:4] == b"\x89PNG"


def test_image_folder_with_labels_csv(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "cat.png")
    (tmp_path / "labels.csv").write_text(
        "id,image,question,answer,answer_type,boxes,objects\n"
        'c1,cat.png,Where is the cat?,,box,"[[0, 0, 4, 4]]","[""cat""]"\n'
        "c2,cat.png,Is it a cat?,yes,yesno,,\n"
    )
    a, b = load_samples(tmp_path).samples
    assert a.image == str(tmp_path / "cat.png") and a.boxes == [[0, 0, 4, 4]] and a.objects == ["cat"]
    assert b.answer == "yes" and b.boxes == []
    (tmp_path / "labels.csv").write_text("id,image,question,answer,answer_type\nc3,cat.png,Q,,number\n")
    with pytest.raises(DataError, match=r"labels.csv, row 2, field 'answer'"):
        load_samples(tmp_path)


def test_unknown_format_and_missing_path(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_samples(tmp_path / "none.jsonl")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match="cannot tell the format"):
        load_samples(tmp_path / "x.txt")


def test_write_jsonl_round_trip(tmp_path, shapes_dir):
    samples = load_samples(shapes_dir / "train.jsonl").samples
    write_jsonl(samples, tmp_path / "copy.jsonl")
    first = json.loads((tmp_path / "copy.jsonl").read_text().splitlines()[0])
    assert first["image"] == f"../{shapes_dir.name}/images/{Path(samples[0].image).name}"  # relative, `..` included
    again = load_samples(tmp_path / "copy.jsonl").samples
    assert [Path(s.image).resolve() for s in again] == [Path(s.image).resolve() for s in samples]
    assert [{**s.to_dict(), "image": None} for s in again] == [{**s.to_dict(), "image": None} for s in samples]


def test_a_json_array_file_is_read_element_by_element(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([_row(), _row(id="b", answer_type="nope")], indent=2))  # LLaVA's .json layout
    result = load_samples(path, errors="skip")
    assert [s.id for s in result.samples] == ["a"] and [(e.row, e.field) for e in result.errors] == [(2, "answer_type")]
    path.write_text('[\n  {"id": "a",\n   "image": }\n]')
    with pytest.raises(DataError, match=r"d.json, row 3: malformed JSON array \(Expecting value at line 3"):
        load_samples(path)
