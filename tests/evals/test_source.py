"""What an eval input is, decided once (`evals/source.py`): benchmarks saved with `DatasetDict.save_to_disk` (MathVista
with testmini + test, MMMU with dev + validation, Geometry3K with train / validation / test) are told apart from Sample
rows, evaluated at their published split unless --split names another, and converted by `vlgrpo data convert`."""

from __future__ import annotations

import json

import pytest
from reasoning_files import MATHVISTA_ROWS, mmmu_rows, png

from vlgrpo.cli import main
from vlgrpo.evals.run import build_eval_data
from vlgrpo.evals.source import is_pope_file, resolve_source

datasets = pytest.importorskip("datasets")


def _save(folder, splits: dict[str, list[dict]]):
    datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()}).save_to_disk(str(folder))
    return folder


def _mathvista(prefix: str) -> list[dict]:
    """The hub's MathVista rows: the image decoded into the row (a saved dataset has no folder to resolve paths)."""
    rows = []
    for pid, row in MATHVISTA_ROWS.items():
        rows.append({**row, "pid": f"{prefix}{pid}", "decoded_image": {"bytes": png(), "path": None}})
    return rows


def _geometry3k(prefix: str) -> list[dict]:
    answers = ("2\\sqrt{3}", "60", "\\frac{40}{3}")
    image = [{"bytes": png(), "path": None}]
    return [{"images": image, "problem": f"<image>{prefix} {i}.", "answer": a} for i, a in enumerate(answers)]


@pytest.fixture
def saved(tmp_path):
    mmmu = mmmu_rows()
    return {
        "mathvista": _save(tmp_path / "mathvista", {"testmini": _mathvista("m"), "test": _mathvista("t")}),
        "mmmu": _save(
            tmp_path / "mmmu",
            {"dev": [dict(r, id=r["id"].replace("validation", "dev")) for r in mmmu], "validation": mmmu},
        ),
        "geometry3k": _save(
            tmp_path / "geometry3k",
            {"train": _geometry3k("Train"), "validation": _geometry3k("Val"), "test": _geometry3k("Test")},
        ),
    }


PUBLISHED = {"mathvista": "testmini", "mmmu": "validation", "geometry3k": "test"}
OTHER = {"mathvista": "test", "mmmu": "dev", "geometry3k": "train"}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_saved_benchmark_is_evaluated_at_its_published_split_or_the_one_asked(saved, name):
    """They used to be read as Sample rows at DIR[test] and stop at 'row 1, field 'choices': unknown field' (MathVista),
    'explanation' (MMMU), 'problem' (Geometry3K)."""
    source = resolve_source(saved[name])
    assert (source.kind, source.benchmark, source.split) == ("benchmark", name, PUBLISHED[name])
    published = build_eval_data(saved[name], name).by_suite[name]
    other = build_eval_data(resolve_source(saved[name], split=OTHER[name]), name).by_suite[name]
    assert published and other and len(published) == len(other)
    if name == "mathvista":
        assert [s.meta["pid"] for s in published] == [f"m{p}" for p in MATHVISTA_ROWS]
        assert [s.meta["pid"] for s in other] == [f"t{p}" for p in MATHVISTA_ROWS]
    if name == "mmmu":
        assert all(s.id.startswith("validation_") for s in published) and all(s.id.startswith("dev_") for s in other)
    if name == "geometry3k":
        assert [s.question for s in published] == ["Test 0.", "Test 1.", "Test 2."]
        assert [s.question for s in other] == ["Train 0.", "Train 1.", "Train 2."]


def test_a_saved_geometry3k_converts_with_its_preset_train_first_or_the_split_asked(saved, tmp_path, capsys):
    """`vlgrpo data convert` reads a saved dataset at its train split when it has one, else as an eval would (the
    published split), and --split still chooses: it used to read train and stop on a dict without one."""
    assert (
        main(["data", "convert", str(saved["geometry3k"]), "--preset", "easyr1", "--out", str(tmp_path / "g.jsonl")])
        == 0
    )
    rows = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert [r["question"] for r in rows] == ["Train 0.", "Train 1.", "Train 2."]
    out = tmp_path / "t.jsonl"
    assert (
        main(["data", "convert", str(saved["geometry3k"]), "--preset", "easyr1", "--split", "test", "--out", str(out)])
        == 0
    )
    assert [json.loads(line)["question"] for line in out.read_text().splitlines()] == ["Test 0.", "Test 1.", "Test 2."]
    # MathVista has no train split: its published one, testmini, is read (the rows whose answer_type MathVista
    # spells otherwise, float / integer / list, are listed as invalid, with exit status 1)
    out = tmp_path / "m.jsonl"
    columns = "question=question,answer=answer,image=decoded_image,id=pid"
    assert main(["data", "convert", str(saved["mathvista"]), "--columns", columns, "--out", str(out)]) == 1
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["m3"]
    assert "mathvista[testmini], row 1" in capsys.readouterr().out


def test_a_preset_that_reads_the_shape_keeps_it_as_rows_and_the_suite_reads_the_benchmark(saved):
    """A run trained with preset easyr1 on an EasyR1 Geometry3K file keeps reading it as its own Samples; the
    geometry3k suite then reads the benchmark itself, at the same split."""
    source = resolve_source(saved["geometry3k"], preset="easyr1")
    assert (source.kind, source.benchmark, source.split) == ("rows", "geometry3k", "test")
    picked = build_eval_data(source, "geometry3k").by_suite["geometry3k"]
    assert [s.question for s in picked] == ["Test 0.", "Test 1.", "Test 2."]


def test_a_pope_file_rows_and_nothing(tmp_path, shapes_dir):
    pope = tmp_path / "pope.jsonl"
    pope.write_text(json.dumps({"question_id": 1, "image": "a.jpg", "text": "Is there a cat?", "label": "yes"}) + "\n")
    assert is_pope_file(pope) and resolve_source(pope).kind == "pope"
    rows = resolve_source(shapes_dir / "test.jsonl")
    assert (rows.kind, rows.benchmark, rows.split) == ("rows", None, None)
    assert resolve_source(None).kind == "none"
