import json
from collections import Counter
from fractions import Fraction

import pytest

from vlgrpo.cli import main
from vlgrpo.data.schema import DataError
from vlgrpo.evals.pope.build import (
    SPLITS,
    ImageObjects,
    build_pope,
    question_text,
    read_object_lists,
    write_pope,
)
from vlgrpo.evals.pope.score import (
    parse_answer,
    pope_metrics,
    read_predictions,
    score_predictions,
)
from vlgrpo.types import InputError

# ---------------------------------------------------------------- parsers


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Yes, there is a dog in the image.", "yes"),
        ("No, there is no dog.", "no"),
        ("There is not a dog", "no"),
        ("The answer is no.", "no"),
        ("Yes. But there is no cat.", "yes"),  # only the first sentence counts
        ("nothing like it", "yes"),  # whole words only
        ("NO", "yes"),  # the original only knows `No`, `not`, `no`
        ("No\nthere is none", "yes"),  # the original splits on single spaces
        ("<think>no idea</think><answer>Yes</answer>", "yes"),  # the answer block is judged alone
        ("<answer>No</answer>", "no"),
        ("", "yes"),
    ],
)
def test_pope_parser_reproduces_the_original_rule(text, expected):
    assert parse_answer(text, "pope") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Yes", "yes"),
        ("No.", "no"),
        ("NO", "no"),
        ("(yes)", "yes"),
        ("Yes, no", "unknown"),
        ("yes-no", "unknown"),  # '-' not next to a space becomes a space: "yes no"
        ("I cannot tell", "unknown"),
        ("noted", "unknown"),
        ("<answer>no</answer>", "no"),
        ("<think>yes or no?</think><answer>No</answer>", "no"),
    ],
)
def test_vlmevalkit_parser(text, expected):
    assert parse_answer(text, "vlmevalkit") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Yes", "yes"),
        (" no. ", "no"),
        ("**Yes.**", "yes"),
        ("<answer> No </answer>", "no"),
        ("Yes, there is", "unknown"),
        ("yes yes", "unknown"),
        ("", "unknown"),
    ],
)
def test_strict_parser(text, expected):
    assert parse_answer(text, "strict") == expected


def test_unknown_parser_is_refused():
    with pytest.raises(InputError, match="pope, vlmevalkit, strict"):
        parse_answer("yes", "llm")


# ---------------------------------------------------------------- metrics

# Eight hand-made answers; the comment gives the parse by pope / vlmevalkit / strict.
ANSWERS = [
    ("yes", "Yes, there is a dog in the image."),  # yes / yes / unknown
    ("yes", "No"),  # no / no / no
    ("yes", "I think so."),  # yes / unknown / unknown
    ("yes", "yes"),  # yes / yes / yes
    ("no", "No, there is not."),  # no / no / unknown
    ("no", "Yes."),  # yes / yes / yes
    ("no", "NO"),  # yes / no / no
    ("no", "Yes and no"),  # no / unknown / unknown
]
F = Fraction
EXPECTED = {
    # tp fp tn fn unknown | accuracy precision recall yes_ratio
    "pope": ((3, 2, 2, 1, 0), (F(5, 8), F(3, 5), F(3, 4), F(5, 8))),
    "vlmevalkit": ((2, 1, 2, 1, 2), (F(4, 8), F(2, 3), F(2, 4), F(3, 8))),
    "strict": ((1, 1, 1, 1, 4), (F(2, 8), F(1, 2), F(1, 4), F(2, 8))),
}


@pytest.mark.parametrize("parser", ["pope", "vlmevalkit", "strict"])
def test_confusion_matrix_and_rates_by_hand(parser):
    preds = [parse_answer(text, parser) for _, text in ANSWERS]
    m = pope_metrics(preds, [label for label, _ in ANSWERS])
    (tp, fp, tn, fn, unknown), (acc, prec, rec, yes_ratio) = EXPECTED[parser]
    assert (m["tp"], m["fp"], m["tn"], m["fn"], m["unknown"], m["n"]) == (tp, fp, tn, fn, unknown, 8)
    assert m["accuracy"] == pytest.approx(float(acc))
    assert m["precision"] == pytest.approx(float(prec))
    assert m["recall"] == pytest.approx(float(rec))
    assert m["f1"] == pytest.approx(float(2 * prec * rec / (prec + rec)))
    assert m["yes_ratio"] == pytest.approx(float(yes_ratio))


def test_zero_denominators_give_zero_not_an_error():
    m = pope_metrics(["no", "no", "unknown"], ["yes", "no", "no"])
    assert (m["precision"], m["recall"], m["f1"], m["yes_ratio"]) == (0.0, 0.0, 0.0, 0.0)
    assert m["accuracy"] == pytest.approx(1 / 3)
    assert pope_metrics(["yes"], ["no"])["recall"] == 0.0  # no yes labels at all


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _pred_file(tmp_path):
    rows = [
        {"question_id": i, "text": text, "label": label, "split": "adversarial"}
        for i, (label, text) in enumerate(ANSWERS, start=1)
    ]
    rows += [
        {"question_id": 1, "text": "Yes", "label": "yes", "split": "random"},
        {"question_id": 2, "text": "No", "label": "no", "split": "random"},
        {"question_id": 3, "text": "Yes", "label": "no", "split": "random"},
        {"question_id": 4, "text": "No", "label": "yes", "split": "random"},
    ]
    return _write_rows(tmp_path / "preds.jsonl", rows)


def test_score_per_split_and_mean(tmp_path):
    result = score_predictions(read_predictions(_pred_file(tmp_path)), "pope")
    assert list(result["splits"]) == ["random", "adversarial"]  # POPE's order, not file order
    rnd = result["splits"]["random"]
    assert (rnd["tp"], rnd["fp"], rnd["tn"], rnd["fn"]) == (1, 1, 1, 1)
    assert rnd["accuracy"] == rnd["precision"] == rnd["recall"] == rnd["f1"] == rnd["yes_ratio"] == 0.5
    assert result["splits"]["adversarial"]["accuracy"] == pytest.approx(5 / 8)
    assert result["mean"]["accuracy"] == pytest.approx((0.5 + 5 / 8) / 2)


def test_cli_eval_score_json(tmp_path, capsys):
    assert (
        main(
            [
                "eval",
                "score",
                "--suite",
                "pope",
                "--pred",
                str(_pred_file(tmp_path)),
                "--parser",
                "vlmevalkit",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    adv = out["splits"]["adversarial"]
    assert out["parser"] == "vlmevalkit" and out["suite"] == "pope"
    assert set(adv) >= {"accuracy", "precision", "recall", "f1", "yes_ratio", "unknown"}
    assert (adv["unknown"], adv["accuracy"], adv["yes_ratio"]) == (2, 0.5, 0.375)


def test_cli_eval_score_table_and_bare_eval(tmp_path, capsys):
    assert main(["eval", "score", "--suite", "pope", "--pred", str(_pred_file(tmp_path))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "POPE, parser 'pope'" and lines[2].split()[:3] == ["random", "4", "0.5000"]
    assert main(["eval"]) == 2


@pytest.mark.parametrize(
    "row, field, fragment",
    [
        ({"question_id": 1, "text": "Yes", "label": "maybe"}, "label", "'yes' or 'no'"),
        ({"question_id": 1, "label": "yes"}, "text", "model's answer"),
        ({"text": "Yes", "label": "yes"}, "question_id", "is required"),
    ],
)
def test_bad_prediction_rows_name_row_and_field(tmp_path, row, field, fragment):
    path = _write_rows(tmp_path / "p.jsonl", [{"question_id": 0, "text": "No", "label": "no"}, row])
    with pytest.raises(DataError, match=fragment) as e:
        read_predictions(path)
    assert (e.value.row, e.value.field) == (2, field)


def test_repeated_question_id_without_split_is_an_error(tmp_path):
    rows = [{"question_id": 1, "text": "No", "label": "no"}, {"question_id": 1, "text": "Yes", "label": "yes"}]
    with pytest.raises(DataError, match="'split' key per row"):
        read_predictions(_write_rows(tmp_path / "p.jsonl", rows))


# ---------------------------------------------------------------- builder

# Designed so every ranking the builder uses is unambiguous for the image T = {cake, fork}:
# popular (absent from T): person 5 > car 4 > knife 2 = plate 2 > bus 1;
# co-occurrence: cake -> knife 2 > fork 1; fork -> plate 2 > cake 1; person -> car 4 > bus 1; car -> person only.
DESIGNED = [
    ("T", ("cake", "fork")),
    ("a1", ("cake", "knife")),
    ("a2", ("cake", "knife")),
    ("a3", ("fork", "plate")),
    ("a4", ("fork", "plate")),
    ("b5", ("person", "bus")),
] + [(f"p{i}", ("person", "car")) for i in range(4)]


def _designed(seed=0, **kw):
    images = [ImageObjects(f"{name}.jpg", objs, name) for name, objs in DESIGNED]
    return build_pope(images, n_images=None, per_image=2, min_objects=2, seed=seed, **kw)


def _per_image(rows):
    out: dict = {}
    for r in rows:
        out.setdefault(r["image"], []).append(r)
    return out


def test_popular_and_adversarial_negatives_by_hand():
    pope = _designed()
    t_pop = _per_image(pope.questions["popular"])["T.jpg"]
    assert [r["object"] for r in t_pop if r["label"] == "no"] == ["person", "car"]  # most frequent absent first
    t_adv = _per_image(pope.questions["adversarial"])["T.jpg"]
    pairs = {t_adv[i]["object"]: t_adv[i + 1]["object"] for i in (0, 2)}  # yes object -> the no right after it
    assert pairs == {"cake": "knife", "fork": "plate"}
    p_adv = _per_image(pope.questions["adversarial"])["p0.jpg"]
    pairs = {p_adv[i]["object"]: p_adv[i + 1]["object"] for i in (0, 2)}
    assert pairs["person"] == "bus"  # car, its top partner, is in the image
    assert pairs["car"] in {"cake", "fork", "knife", "plate"}  # nothing co-occurs with car: random fallback
    assert question_text("Is there a {object} here?", "orange circle") == "Is there an orange circle here?"


def _cooccur(images):
    co = Counter()
    for im in images:
        co.update((a, b) for a in im.objects for b in im.objects if a != b)
    return co


def _check_pope(pope, per_image):
    """Balance, absence of negatives and the adversarial ranking, checked against counts made here."""
    objects = {im.image: set(im.objects) for im in pope.images}
    co = _cooccur(pope.images)
    vocab = set().union(*objects.values())
    positives = None
    for split, rows in pope.questions.items():
        assert [r["question_id"] for r in rows] == list(range(1, len(rows) + 1))
        assert [r["label"] for r in rows] == ["yes", "no"] * (len(rows) // 2)
        by_image = _per_image(rows)
        assert list(by_image) == [im.image for im in pope.images]
        split_positives = []
        for image, qs in by_image.items():
            yes = [q["object"] for q in qs if q["label"] == "yes"]
            no = [q["object"] for q in qs if q["label"] == "no"]
            assert len(yes) == len(no) == per_image and len(set(yes + no)) == 2 * per_image
            assert set(yes) <= objects[image] and not set(no) & objects[image] and set(no) <= vocab
            split_positives.append(yes)
            if split == "adversarial":
                used = set(objects[image])
                for pos, neg in zip(yes, no):
                    best = max((co[(pos, o)] for o in vocab - used), default=0)
                    assert co[(pos, neg)] == best  # the top remaining co-occurring object (or random when all 0)
                    used.add(neg)
        positives = positives or split_positives
        assert split_positives == positives  # same images and positives in every split


def test_designed_set_properties():
    _check_pope(_designed(), per_image=2)


def test_shapes_dataset_builds_balanced_probes(shapes_dir):
    rows = [json.loads(line) for line in (shapes_dir / "train.jsonl").read_text().splitlines()]
    eligible = sum(len(set(r["objects"])) >= 3 for r in rows)
    images = read_object_lists(shapes_dir / "train.jsonl")
    pope = build_pope(images, n_images=eligible, seed=3)
    assert (pope.read, pope.skipped, len(pope.images)) == (len(rows), len(rows) - eligible, eligible)
    assert {k: len(v) for k, v in pope.questions.items()} == dict.fromkeys(SPLITS, 6 * eligible)
    _check_pope(pope, per_image=3)
    first = pope.questions["random"][0]
    assert first["sample_id"].startswith("shapes-train-") and first["split"] == "random"


def test_seed_controls_the_build():
    images = [ImageObjects(f"{i}.jpg", tuple(f"o{(i * 7 + k) % 13}" for k in range(4)), str(i)) for i in range(30)]
    a, b, c = (build_pope(images, n_images=20, seed=s) for s in (1, 1, 2))
    assert a.questions == b.questions and a.questions != c.questions


def test_skips_and_refusals():
    images = [ImageObjects("a.jpg", ("x", "y", "z")), ImageObjects("b.jpg", ("x", "y"))]
    with pytest.raises(InputError, match="1 of 2 images have >= 3"):
        build_pope(images, n_images=2)
    with pytest.raises(InputError, match="fewer than the 3 negatives"):
        build_pope(images, n_images=1)  # the vocabulary of one image has nothing absent from it
    with pytest.raises(InputError, match="--per-image"):
        build_pope(images, per_image=3, min_objects=2)
    with pytest.raises(InputError, match="{object}"):
        build_pope(images, template="Is there a thing?")


def test_coco_instances_and_pope_objects_sources(tmp_path):
    coco = {
        "images": [{"id": 1, "file_name": "COCO_val2014_000000000001.jpg"}, {"id": 2, "file_name": "b.jpg"}],
        "categories": [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}],
        "annotations": [
            {"image_id": 1, "category_id": 3},
            {"image_id": 1, "category_id": 1},
            {"image_id": 1, "category_id": 3},
        ],
    }
    (tmp_path / "instances.json").write_text(json.dumps(coco))
    images = read_object_lists(tmp_path / "instances.json")
    assert images == [  # annotation order, duplicates merged; b.jpg has no annotations (skipped by the builder)
        ImageObjects("COCO_val2014_000000000001.jpg", ("car", "person"), "1"),
        ImageObjects("b.jpg", (), "2"),
    ]
    _write_rows(tmp_path / "seg.json", [{"image": "x.jpg", "objects": ["bowl", "spoon", "bowl"]}])
    assert read_object_lists(tmp_path / "seg.json") == [ImageObjects("x.jpg", ("bowl", "spoon"))]
    coco["annotations"].append({"image_id": 9, "category_id": 1})
    (tmp_path / "bad.json").write_text(json.dumps(coco))
    with pytest.raises(DataError, match="unknown image_id 9"):
        read_object_lists(tmp_path / "bad.json")


def test_write_and_cli(tmp_path, capsys):
    objects = [{"image": f"/data/{name}.jpg", "objects": list(objs)} for name, objs in DESIGNED]
    src = _write_rows(tmp_path / "objects.jsonl", objects)
    paths = write_pope(_designed(), tmp_path / "out", "toy")
    rows = [json.loads(line) for line in paths["random"].read_text().splitlines()]
    assert set(rows[0]) >= {"question_id", "image", "text", "label"}
    assert rows[0]["image"] == rows[0]["sample_id"] + ".jpg"
    assert (
        main(
            [
                "data",
                "pope",
                "--source",
                str(src),
                "--out",
                str(tmp_path / "cli"),
                "--name",
                "toy",
                "--n-images",
                "0",
                "--per-image",
                "2",
                "--min-objects",
                "2",
            ]
        )
        == 0
    )
    assert "popular: 40 questions (20 yes)" in capsys.readouterr().out
    written = json.loads((tmp_path / "cli" / "toy_pope_popular.jsonl").read_text().splitlines()[0])
    assert written["image"].endswith(".jpg") and written["image"].startswith("..")  # relative to the out folder


def test_cli_eval_score_names_the_line_and_byte_of_a_non_utf8_prediction(tmp_path, capsys):
    good = json.dumps({"question_id": 1, "text": "Yes", "label": "yes"}).encode() + b"\n"
    bad = json.dumps({"question_id": 2, "text": "Oui, il y a un caf\u00e9", "label": "yes"}, ensure_ascii=False).encode(
        "latin-1"
    )
    path = tmp_path / "preds.jsonl"
    path.write_bytes(good + bad + b"\n")
    assert main(["eval", "score", "--suite", "pope", "--pred", str(path)]) == 2
    err = capsys.readouterr().err
    offset = len(good) + bad.index(b"\xe9")
    assert f"error: {path}, row 2: is not UTF-8: byte 0xe9 at byte offset {offset} (line 2)" in err
    assert "UTF-8 JSON Lines" in err and "Traceback" not in err


def test_a_line_separator_inside_a_prediction_is_not_a_line_break(tmp_path):
    """U+2028 is legal unescaped inside a JSON string (json.dumps(..., ensure_ascii=False) writes it raw)."""
    rows = [
        {"question_id": 1, "text": "Yes\u2028there is", "label": "yes"},
        {"question_id": 2, "text": "No", "label": "no"},
    ]
    path = tmp_path / "preds.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert [p.text for p in read_predictions(path)] == ["Yes\u2028there is", "No"]
