import io
import json

import pytest
from PIL import Image

from vlgrpo.data.schema import DataError
from vlgrpo.evals import benchmarks
from vlgrpo.evals.benchmarks import load_manifest, load_refcoco
from vlgrpo.evals.pope import files as pope_files
from vlgrpo.evals.pope.files import load_pope


def _image(path, size=(64, 48)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (200, 10, 10)).save(path)
    return path


def _png_bytes(size):
    buf = io.BytesIO()
    Image.new("RGB", size, (0, 90, 200)).save(buf, format="PNG")
    return buf.getvalue()


def _lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- POPE

OFFICIAL = [  # the official files' format: JSON lines named .json, no split key
    {
        "question_id": 1,
        "image": "COCO_val2014_000000310196.jpg",
        "text": "Is there a snowboard in the image?",
        "label": "yes",
    },
    {
        "question_id": 2,
        "image": "COCO_val2014_000000310196.jpg",
        "text": "Is there a backpack in the image?",
        "label": "no",
    },
    {
        "question_id": 3,
        "image": "COCO_val2014_000000210789.jpg",
        "text": "Is there an umbrella in the image?",
        "label": "yes",
    },
]


def test_pope_official_question_file_with_image_dir(tmp_path):
    images = tmp_path / "val2014"
    for row in OFFICIAL:
        _image(images / row["image"])
    path = _lines(tmp_path / "coco_pope_adversarial.json", OFFICIAL)
    samples = load_pope(path, image_dir=images)
    assert [s.id for s in samples] == ["pope-adversarial-1", "pope-adversarial-2", "pope-adversarial-3"]
    s = samples[1]
    assert (s.question, s.answer, s.answer_type, s.task) == (
        "Is there a backpack in the image?",
        "no",
        "yesno",
        "pope/adversarial",
    )
    assert s.image == str(images / "COCO_val2014_000000310196.jpg")
    with pytest.raises(DataError, match="splits found: adversarial"):
        load_pope(path, image_dir=images, split="random")


def test_pope_missing_images_and_bad_labels_are_named(tmp_path):
    path = _lines(tmp_path / "coco_pope_random.json", OFFICIAL)
    with pytest.raises(DataError, match="2 of 2 images are missing.*image_dir"):
        load_pope(path)
    assert len(load_pope(path, check_images=False)) == 3
    bad = _lines(tmp_path / "q.jsonl", [dict(OFFICIAL[0], label="Maybe")])
    with pytest.raises(DataError, match="'yes' or 'no'") as e:
        load_pope(bad, check_images=False)
    assert (e.value.row, e.value.field) == (1, "label")


def test_pope_builder_output_round_trips(tmp_path):
    _image(tmp_path / "imgs" / "a.png")
    rows = [
        {
            "question_id": 1,
            "image": "../imgs/a.png",
            "text": "Is there a red circle in the image?",
            "label": "yes",
            "split": "popular",
            "object": "red circle",
            "sample_id": "shapes-train-000003",
        }
    ]
    (tmp_path / "out").mkdir()
    (s,) = load_pope(_lines(tmp_path / "out" / "x.jsonl", rows))
    assert s.task == "pope/popular" and s.meta["sample_id"] == "shapes-train-000003"
    assert s.image == str(tmp_path / "out" / ".." / "imgs" / "a.png")


def test_pope_saved_hf_dataset_in_lmms_lab_layout(tmp_path):
    import datasets

    features = datasets.Features(
        {
            "question_id": datasets.Value("string"),
            "question": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "image": datasets.Image(),
            "category": datasets.Value("string"),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "question_id": ["7", "8"],
            "question": ["Is there a car in the image?", "Is there a dog in the image?"],
            "answer": ["Yes", "no"],
            "image": [{"bytes": _png_bytes((20, 10)), "path": None}] * 2,
            "category": ["popular", "random"],
        },
        features=features,
    )
    datasets.DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "pope_hf"))
    samples = load_pope(tmp_path / "pope_hf")
    assert [(s.id, s.answer, s.task) for s in samples] == [
        ("pope-popular-7", "yes", "pope/popular"),
        ("pope-random-8", "no", "pope/random"),
    ]
    assert isinstance(samples[0].image, bytes) and samples[0].image[:4] == b"\x89PNG"
    assert [s.id for s in load_pope(tmp_path / "pope_hf", split="random")] == ["pope-random-8"]


# ---------------------------------------------------------------- RefCOCO


def test_refcoco_refs_json(tmp_path):
    _image(tmp_path / "train2014" / "COCO_train2014_000000000009.jpg", (640, 480))
    refs = [
        {
            "ref_id": 5,
            "file_name": "COCO_train2014_000000000009.jpg",
            "bbox": [10, 20, 100, 50.5],
            "sentences": [{"sent": "man on left", "raw": "Man on left."}, "guy in red"],
            "split": "val",
            "width": 640,
            "height": 480,
        },
        {
            "ref_id": 6,
            "image": "COCO_train2014_000000000009.jpg",
            "bbox": [600, 400, 40.4, 80.3],
            "expression": "dog",
            "split": "testA",
            "width": 640,
            "height": 480,
        },
    ]
    path = _lines(tmp_path / "refcoco_unc.jsonl", refs)
    samples = load_refcoco(path, image_dir=tmp_path / "train2014")
    assert [s.id for s in samples] == ["refcoco-val-5-0", "refcoco-val-5-1", "refcoco-testA-6-0"]
    s = samples[1]
    assert (s.answer_type, s.boxes, s.image_size, s.task) == (
        "box",
        [[10.0, 20.0, 110.0, 70.5]],
        (640, 480),
        "refcoco/val",
    )
    assert s.question == 'Locate the object described as "guy in red".' and s.meta["expression"] == "guy in red"
    assert samples[2].boxes == [[600.0, 400.0, 640.0, 480.0]]  # 0.4 / 0.3 px of float noise clipped to the border
    assert [s.id for s in load_refcoco(path, image_dir=tmp_path / "train2014", split="testA")] == ["refcoco-testA-6-0"]


def test_refcoco_refer_style_refs_with_instances(tmp_path):
    _image(tmp_path / "COCO_train2014_000000000009.jpg", (320, 240))
    instances = {
        "images": [{"id": 9, "file_name": "COCO_train2014_000000000009.jpg", "width": 320, "height": 240}],
        "annotations": [{"id": 77, "image_id": 9, "bbox": [1.5, 2.0, 30.0, 40.0], "category_id": 1}],
    }
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    # refs(unc).p dumped to JSON: its file_name has an annotation suffix and is not a real file.
    refs = [
        {
            "ref_id": 1,
            "ann_id": 77,
            "image_id": 9,
            "file_name": "COCO_train2014_000000000009_77.jpg",
            "split": "testB",
            "sentences": [{"tokens": ["left", "cup"], "raw": "left cup", "sent": "left cup"}],
        }
    ]
    path = tmp_path / "refs_unc.json"
    path.write_text(json.dumps(refs))  # a JSON array this time
    (s,) = load_refcoco(path, instances=tmp_path / "instances.json", name="refcoco+")
    assert (s.id, s.boxes, s.image_size) == ("refcoco+-testB-1-0", [[1.5, 2.0, 31.5, 42.0]], (320, 240))
    assert s.image == str(tmp_path / "COCO_train2014_000000000009.jpg") and s.meta["ann_id"] == 77
    with pytest.raises(DataError, match="instances.json"):
        load_refcoco(path)
    refs[0]["bbox"] = [1, 1, 5, 5]  # with a box but no instances, refer's suffixed file_name is not a file
    path.write_text(json.dumps(refs))
    with pytest.raises(DataError, match="1 of 1 images are missing.*need instances"):
        load_refcoco(path)


def test_refcoco_size_read_from_the_image_and_bad_rows(tmp_path):
    _image(tmp_path / "a.jpg", (50, 40))
    path = _lines(tmp_path / "r.jsonl", [{"image": "a.jpg", "bbox": [5, 5, 10, 10], "expression": "box"}])
    (s,) = load_refcoco(path)
    assert (s.image_size, s.boxes, s.id) == ((50, 40), [[5.0, 5.0, 15.0, 15.0]], "refcoco-all-1-0")
    outside = _lines(tmp_path / "o.jsonl", [{"image": "a.jpg", "bbox": [45, 5, 10, 10], "expression": "box"}])
    with pytest.raises(DataError, match="outside the 50x40 image"):
        load_refcoco(outside)
    no_expr = _lines(tmp_path / "n.jsonl", [{"image": "a.jpg", "bbox": [5, 5, 10, 10], "split": "val"}])
    with pytest.raises(DataError, match="no referring expression"):
        load_refcoco(no_expr)
    xyxy = _lines(tmp_path / "b.jsonl", [{"image": "a.jpg", "bbox": [5, 5, 10], "expression": "box"}])
    with pytest.raises(DataError, match=r"\[x, y, width, height\]"):
        load_refcoco(xyxy)


def test_refcoco_saved_hf_dataset_in_lmms_lab_layout(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict(
        {
            "question_id": ["101", "102"],
            "question": ["Please carefully observe the area circled in the image and come up with a caption."] * 2,
            "answer": [["left zebra", "zebra on the left"], ["right zebra"]],
            "bbox": [[0.0, 4.0, 30.0, 20.0], [40.0, 0.0, 39.5, 59.5]],
            "image": [{"bytes": _png_bytes((80, 60)), "path": None}] * 2,
            "file_name": ["COCO_train2014_000000000001.jpg"] * 2,
        },
        features=datasets.Features(
            {
                "question_id": datasets.Value("string"),
                "question": datasets.Value("string"),
                "answer": datasets.Sequence(datasets.Value("string")),
                "bbox": datasets.Sequence(datasets.Value("float32")),
                "image": datasets.Image(),
                "file_name": datasets.Value("string"),
            }
        ),
    )
    datasets.DatasetDict({"val": ds}).save_to_disk(str(tmp_path / "refcoco_hf"))
    samples = load_refcoco(tmp_path / "refcoco_hf", split="val")
    assert [s.id for s in samples] == ["refcoco-val-101-0", "refcoco-val-101-1", "refcoco-val-102-0"]
    assert [s.meta["expression"] for s in samples] == ["left zebra", "zebra on the left", "right zebra"]
    assert samples[2].boxes == [[40.0, 0.0, 79.5, 59.5]] and samples[2].image_size == (80, 60)
    assert isinstance(samples[0].image, bytes)


# ---------------------------------------------------------------- manifests


@pytest.mark.parametrize("name", ["pope_coco", "refcoco"])
def test_manifests_name_real_loaders_and_splits(name):
    manifest = load_manifest(name)
    assert callable(getattr(pope_files if name == "pope_coco" else benchmarks, manifest["loader"]))
    assert manifest["splits"] and manifest["prepare"]
    if name == "pope_coco":
        files = manifest["sources"]["questions"]["files"]
        assert {f"coco_pope_{s}.json" for s in manifest["splits"]} == set(files)
        assert all(len(f["sha256"]) == 64 and f["rows"] == 3000 for f in files.values())
