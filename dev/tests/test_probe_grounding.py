"""dev/probe_grounding.py: the box a probe reads from an answer, its scores, and a run on the shipped base."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1]  # dev/, where the probe and the base builder live
BASE = Path(__file__).resolve().parents[2] / "data" / "models" / "shapes-tiny-qwen2_5_vl"


@pytest.fixture(scope="module")
def pg():
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("probe_grounding", SCRIPTS / "probe_grounding.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_asked_box_takes_the_first_box_or_the_first_with_the_asked_label(pg):
    text = json.dumps(
        [
            {"bbox_2d": [1, 2, 3, 4], "label": "red circle"},
            {"bbox_2d": [5, 6, 7, 8], "label": "blue square"},
            {"bbox_2d": [9, 10, 11, 12], "label": "blue square"},
        ]
    )
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
    synth_dataset(tmp_path / "count", 20, seed=3, kinds=("count",))
    with pytest.raises(SystemExit, match="no 'Locate the ...' box questions"):
        pg.probe(str(BASE), tmp_path / "count", "test", 8)


def test_ridge_mae_is_zero_for_a_linear_target_and_the_mean_error_for_noise(pg):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(400, 5, generator=gen)
    y = torch.stack([3 * x[:, 0] - 2 * x[:, 4] + 7, torch.randn(400, generator=gen)], 1)
    err = pg.ridge_mae(x, y, ridge=1e-6)
    assert err[0] < 1e-4  # the linear column is recovered
    assert err[1] > 0.6  # noise stays at its own spread (mean |N(0, 1)| = 0.8)


def test_position_probe_on_the_shipped_base_reads_the_offset_within_a_cell(pg):
    rows = pg.position_probe(str(BASE), scenes=200)
    assert len(rows) == 5  # the merger's output and 4 decoder layers
    merger = rows[0]  # the tower's features carry where an object sits in its 28-px cell, not which cell
    assert merger["cell_x"] < merger["guess_cell_x"] / 2 and merger["cell_y"] < merger["guess_cell_y"] / 2
    assert merger["abs_x"] > merger["guess_abs_x"] * 0.8


def test_distance_probe_on_the_shipped_base_loses_the_box_digits_when_the_caption_moves(pg):
    rows = {(r["move"], r["k"], r["image"]): r for r in pg.distance_probe(str(BASE), moves=(0, 1, 8), scenes=100)}
    assert len(rows) == 12 and rows[("shift", 0, "own")] == {**rows[("sentences", 0, "own")], "move": "shift"}
    gain = {k: rows[("shift", k, "own")]["tens"] - rows[("shift", k, "other")]["tens"] for k in (0, 1, 8)}
    assert gain[0] > 0.08  # in place, the image tells the boxes' tens digits
    assert gain[1] < gain[0] / 2 and abs(gain[8]) < 0.03  # one M-RoPE position later, most of that is gone
    assert rows[("shift", 1, "own")]["other"] > 0.97  # while the labels and the JSON still come out right
    for m in rows.values():
        assert 0.0 <= m["ones"] <= 1.0 and 0.0 <= m["tens"] <= 1.0


def test_distance_probe_shifts_past_the_fillers_but_pads_with_at_most_all_of_them(pg, tiny_model_dir):
    rows = pg.distance_probe(tiny_model_dir("qwen2_5_vl"), moves=(0, 11, 96), scenes=2)
    assert [(r["move"], r["k"], r["image"]) for r in rows] == [
        (m, k, i) for m, ks in (("shift", (0, 11, 96)), ("sentences", (0, 11))) for k in ks for i in ("own", "other")
    ]
