"""scripts/probe_grounding.py: the box a probe reads from an answer, its scores, and a run on the shipped base."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BASE = Path(__file__).resolve().parents[1] / "data" / "models" / "shapes-tiny-qwen2_5_vl"


@pytest.fixture(scope="module")
def pg():
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("probe_grounding", SCRIPTS / "probe_grounding.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_asked_box_takes_the_first_box_or_the_first_with_the_asked_label(pg):
    text = json.dumps([{"bbox_2d": [1, 2, 3, 4], "label": "red circle"},
                       {"bbox_2d": [5, 6, 7, 8], "label": "blue square"},
                       {"bbox_2d": [9, 10, 11, 12], "label": "blue square"}])  # fmt: skip
    assert pg.asked_box(text, None) == (1, 2, 3, 4)
    assert pg.asked_box(text, "blue square") == (5, 6, 7, 8)
    assert pg.asked_box(text, "green circle") is None
    assert pg.asked_box("none", None) is None


def test_score_counts_missing_boxes_as_misses_and_measures_centres_of_the_answered(pg):
    golds = [[0, 0, 20, 20], [0, 0, 20, 20], [50, 50, 70, 70]]
    preds = [(0, 0, 20, 20), (12, 4, 32, 24), None]  # IoU 1; IoU 8*16 / (800 - 128) = 0.19; no answer
    m = pg.score(preds, golds)
    assert m["acc50"] == pytest.approx(1 / 3) and m["answered"] == pytest.approx(2 / 3)
    assert (m["median_dx"], m["median_dy"]) == (6.0, 2.0)  # medians of (0, 12) and (0, 4)


def test_probe_on_the_shipped_base_finds_boxes_for_the_demo_questions(pg, tmp_path):
    from vlgrpo.data.synth import synth_dataset

    synth_dataset(tmp_path, 80, seed=3, image_size=112, kinds=("ground",), max_shapes=3)
    result = pg.probe(str(BASE), tmp_path, "test", 8)
    assert set(result) == {"find", "detect"}
    for m in result.values():  # the base answers its own instructions with boxes; scores are shares
        assert m["answered"] >= 0.5 and 0.0 <= m["acc50"] <= m["answered"]
    with pytest.raises(SystemExit, match="no 'Locate the ...' box questions"):
        synth_dataset(tmp_path / "count", 20, seed=3, kinds=("count",))
        pg.probe(str(BASE), tmp_path / "count", "test", 8)
