"""The reasoning benchmarks' loaders on small hand-written files in each published shape: MathVista's testmini.json
(and its parquet copy), EasyR1's Geometry3K parquet, R1-V's SuperCLEVR JSONL, MMMU's per-subject parquet / JSON rows
(a two-image row refused by name); the manifests and their sha256 pins."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from reasoning_files import (
    MATHVISTA_ROWS,
    SUPERCLEVR_ROWS,
    geometry3k_file,
    mathvista_file,
    mmmu_folder,
    mmmu_rows,
    png,
    save_png,
    superclevr_file,
)

from vlgrpo.data.schema import DataError
from vlgrpo.evals.benchmarks import load_manifest
from vlgrpo.evals.reasoning import files as reasoning_io
from vlgrpo.evals.reasoning import loaders as reasoning
from vlgrpo.evals.reasoning.files import benchmark_of
from vlgrpo.evals.reasoning.loaders import (
    load_benchmark,
    load_geometry3k,
    load_mathvista,
    load_mmmu,
    load_superclevr,
    mathvista_query,
)
from vlgrpo.evals.source import resolve_source
from vlgrpo.registry import EVAL_SUITE
from vlgrpo.types import InputError

BENCHMARKS = ("mathvista", "geometry3k", "superclevr", "mmmu")


# ---------------------------------------------------------------- MathVista


def test_mathvista_json_keyed_by_pid(tmp_path):
    path = mathvista_file(tmp_path)
    samples = load_mathvista(path)
    assert [s.id for s in samples] == [f"mathvista-{p}" for p in MATHVISTA_ROWS]
    by_pid = {s.meta["pid"]: s for s in samples}
    # vqa's view of each row: a choice's gold is its letter, integer/float are numbers, a list is text
    assert {p: (s.answer_type, s.answer) for p, s in by_pid.items()} == {
        "1": ("number", "1.45"),
        "2": ("text", "[2014, 2016]"),
        "3": ("choice", "C"),
        "4": ("number", "3"),
        "5": ("number", "0.8"),
    }
    assert by_pid["3"].meta["choices"] == ["135°", "140°", "145°", "150°"] and by_pid["3"].meta["answer"] == "145°"
    assert (by_pid["1"].meta["precision"], by_pid["1"].meta["task"]) == (2, "figure question answering")
    assert by_pid["3"].meta["skills"] == ["geometry reasoning", "algebraic reasoning"]
    assert by_pid["1"].image == str(tmp_path / "images" / "1.jpg")
    # testmini.json has no `query`: it is built as MathVista's data/query.json holds it
    assert by_pid["4"].question == (
        "Hint: Please answer the question requiring an integer answer and provide the "
        "final value, e.g., 1, 2, 3, at the end.\nQuestion: How many cups? (Unit: g)\n"
    )
    assert by_pid["3"].question.endswith(
        "Question: Find the angle BOC.\nChoices:\n(A) 135°\n(B) 140°\n(C) 145°\n(D) 150°\n"
    )
    assert "two decimal places" in by_pid["1"].question and "Python list" in by_pid["2"].question
    assert benchmark_of(path) == "mathvista"


def test_mathvista_parquet_copy_uses_its_query_and_images(tmp_path):
    """The hub copy's shape: decoded_image bytes, precision a float (NaN / null where there is none), `query`."""
    rows = [
        dict(
            r,
            decoded_image={"bytes": png(), "path": f"{pid}.jpg"},
            query=f"QUERY {pid}",
            precision=float(r["precision"]) if r["precision"] else None,
        )
        for pid, r in MATHVISTA_ROWS.items()
    ]
    path = tmp_path / "data" / "testmini-00000-of-00001.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path)
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "data" / "test-00000-of-00001.parquet")
    samples = load_mathvista(tmp_path / "data")  # a folder: split testmini's files only
    assert len(samples) == 5 and samples[0].question == "QUERY 1\n" and isinstance(samples[0].image, bytes)
    assert samples[0].meta["precision"] == 2 and samples[1].meta["precision"] is None
    assert benchmark_of(tmp_path / "data") == "mathvista" and len(load_benchmark(path)) == 5


def test_mathvista_bad_rows_are_named(tmp_path):
    rows = {"7": dict(MATHVISTA_ROWS["3"], pid="7", answer="146°")}
    (tmp_path / "bad.json").write_text(json.dumps(rows))
    with pytest.raises(DataError, match=r"row 1, field 'answer': '146°' is not one of the choices"):
        load_mathvista(tmp_path / "bad.json", check_images=False)
    with pytest.raises(DataError, match="1 of 5 images are missing"):
        path = mathvista_file(tmp_path)
        (tmp_path / "images" / "5.jpg").unlink()
        load_mathvista(path)


def test_mathvista_query_matches_the_published_hints():
    row = dict(MATHVISTA_ROWS["2"])
    assert mathvista_query(row) == (
        "Hint: Please answer the question requiring a Python list as an answer and provide "
        "the final list, e.g., [1, 2, 3], [1.2, 1.3, 1.4], at the end.\nQuestion: Which "
        "years?"
    )


# ---------------------------------------------------------------- Geometry3K, SuperCLEVR


def test_geometry3k_easyr1_parquet(tmp_path):
    path = geometry3k_file(tmp_path)
    samples = load_geometry3k(tmp_path)  # the downloaded folder: data/test-*.parquet
    assert [(s.id, s.question, s.answer, s.answer_type) for s in samples] == [
        ("geometry3k-1", "Find x.", "2\\sqrt{3}", "math"),
        ("geometry3k-2", "Find m\\angle 2.", "60", "math"),
        ("geometry3k-3", "Find y.", "\\frac{40}{3}", "math"),
    ]
    assert isinstance(samples[0].image, bytes) and benchmark_of(path) == "geometry3k"
    two = tmp_path / "two.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"images": [{"bytes": png(), "path": None}] * 2, "problem": "<image>x", "answer": "1"}]),
        two,
    )
    (both,) = load_geometry3k(two)  # a row with two diagrams keeps both, first in the prompt
    assert len(both.images) == 2 and both.image is None and both.question == "x"


def test_superclevr_r1v_jsonl(tmp_path):
    path = superclevr_file(tmp_path)
    samples = load_superclevr(path)
    assert [(s.id, s.answer, s.answer_type) for s in samples] == [
        ("superclevr-1", "4", "number"),
        ("superclevr-2", "9", "number"),
        ("superclevr-3", "10", "number"),
    ]
    assert samples[0].image == str(tmp_path / "images" / "superCLEVR_new_025000.png")
    assert samples[0].question == "How many different items are there in the image?"
    assert benchmark_of(path) == "superclevr"
    (tmp_path / "bad.jsonl").write_text(json.dumps({**SUPERCLEVR_ROWS[0], "ground_truth": "four"}) + "\n")
    with pytest.raises(DataError, match="field 'ground_truth': must be a whole number"):
        load_superclevr(tmp_path / "bad.jsonl")


# ---------------------------------------------------------------- MMMU


def test_mmmu_rows_with_one_or_several_images(tmp_path):
    """Each <image k> the text names becomes a marker where it is first named (lmms-eval's MMMU prompt); the Math row
    holds two images, in the order its question names them."""
    folder = mmmu_folder(tmp_path / "mmmu")
    samples = load_mmmu(folder)
    assert [s.id for s in samples] == ["validation_Art_Theory_1", "validation_Math_2", "validation_Physics_3"]
    art, math, physics = samples
    assert (art.answer_type, art.answer, art.task, art.meta["subject"]) == (
        "choice",
        "B",
        "mmmu/Art_Theory",
        "Art_Theory",
    )
    assert art.question == "<image> Which colour dominates?\n\n(A) red\n(B) blue\n(C) green\n"
    assert art.meta["options"] == ["red", "blue", "green"] and isinstance(art.image, bytes)
    assert math.question.startswith("Compare <image> and <image>.") and len(math.images) == 2 and math.image is None
    assert math.images[1] != math.images[0]  # image_2 second, as named
    assert (physics.answer_type, physics.answer, physics.meta["question_type"]) == ("number", "1.5", "open")
    assert benchmark_of(folder) == "mmmu"


def test_mmmu_placement_by_hand():
    from vlgrpo.evals.reasoning.loaders import _mmmu_images

    row = {"image_1": "a.png", "image_2": "b.png", "image_3": "c.png"}
    images, q = _mmmu_images(row, "Is <image 3> like <image 1>? (A) <image 3> (B) no", "f", 1)
    assert images == ["b.png", "c.png", "a.png"]  # image 2 is never named: it goes first
    assert q == "<image>Is <image> like <image>? (A) image 3 (B) no"
    assert _mmmu_images({"image_1": "a.png"}, "What is this?", "f", 1) == (["a.png"], "What is this?")
    with pytest.raises(DataError, match="field 'image_2': is empty, but the question names <image 2>"):
        _mmmu_images({"image_1": "a.png"}, "Compare <image 1> and <image 2>.", "f", 1)


def test_mmmu_json_rows_with_image_paths(tmp_path):
    rows = mmmu_rows()
    save_png(tmp_path / "img" / "art.png")
    save_png(tmp_path / "img" / "b.png")
    rows[0]["image_1"] = "img/art.png"
    path = tmp_path / "mmmu_val.jsonl"
    path.write_text(
        json.dumps(rows[0]) + "\n" + json.dumps(dict(rows[1], image_1="img/art.png", image_2="img/b.png")) + "\n"
    )
    first, second = load_mmmu(path, split=None)
    assert first.image == str(tmp_path / "img" / "art.png")
    assert second.images == [str(tmp_path / "img" / "art.png"), str(tmp_path / "img" / "b.png")]


# ---------------------------------------------------------------- manifests, pins, detection


@pytest.mark.parametrize("name", BENCHMARKS)
def test_manifests_name_their_loader_suite_and_sources(name):
    m = load_manifest(name)
    assert m["name"] == name and m["suite"] == name and m["suite"] in EVAL_SUITE.names
    assert callable(getattr(reasoning, m["loader"])) and m["expected"] and m["published"]
    assert m["reference_scores"] == []  # nothing was run here
    for entry in m["published"]:
        assert entry["source"] and entry["model"]


def test_the_loader_checks_the_sha256_a_manifest_pins(tmp_path, monkeypatch):
    path = superclevr_file(tmp_path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    evals = tmp_path / "evals"
    evals.mkdir()
    manifest = {
        "name": "superclevr",
        "suite": "superclevr",
        "loader": "load_superclevr",
        "splits": ["test"],
        "prepare": [],
        "sources": {"questions": {"files": {path.name: {"sha256": "0" * 64}}}},
    }
    (evals / "superclevr.yaml").write_text(json.dumps(manifest))
    monkeypatch.setattr(reasoning_io, "EVALS_DIR", evals)
    with pytest.raises(InputError, match=f"sha256 {digest} is not the {'0' * 64} that evals/superclevr.yaml pins"):
        load_benchmark(path)
    manifest["sources"]["questions"]["files"][path.name]["sha256"] = digest
    (evals / "superclevr.yaml").write_text(json.dumps(manifest))
    assert len(load_benchmark(path)) == 3
    # the real manifest pins R1-V's file by its published name: a hand-made file of that name is refused
    monkeypatch.undo()
    fake = tmp_path / "superclevr_test200_counting_problems.jsonl"
    fake.write_bytes(path.read_bytes())
    with pytest.raises(InputError, match="that evals/superclevr.yaml pins"):
        load_benchmark(fake)


def test_detection_leaves_other_files_alone(tmp_path, shapes_dir):
    assert benchmark_of(shapes_dir / "test.jsonl") is None  # vlgrpo's own rows
    assert benchmark_of(tmp_path / "missing.json") is None and benchmark_of(tmp_path) is None
    (tmp_path / "broken.json").write_text("{not json")
    assert benchmark_of(tmp_path / "broken.json") is None
    g = geometry3k_file(tmp_path / "g")
    kind = lambda preset: resolve_source(g, preset=preset).kind  # noqa: E731
    assert kind("none") == "benchmark" and kind("easyr1") == "rows"  # a preset that reads the shape keeps it as rows
    assert kind("r1v") == "benchmark"
    with pytest.raises(InputError, match="not a file of mathvista, geometry3k, superclevr, mmmu"):
        load_benchmark(shapes_dir / "test.jsonl")
