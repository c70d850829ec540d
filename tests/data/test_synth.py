import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from vlgrpo.cli import main
from vlgrpo.data.adapters import load_samples
from vlgrpo.data.synth import KINDS, synth_dataset
from vlgrpo.types import InputError


def test_cli_synth_200_reads_back_with_every_field(tmp_path, capsys):
    assert main(["data", "synth", "--out", str(tmp_path), "--n", "200", "--seed", "3"]) == 0
    assert "train: 160 samples" in capsys.readouterr().out
    samples = [s for split in ("train", "val", "test") for s in load_samples(tmp_path / f"{split}.jsonl").samples]
    assert len(samples) == 200 and len({s.id for s in samples}) == 200
    for s in samples:
        assert s.id and s.question and s.answer and s.answer_type and s.task and s.meta and s.objects
        assert s.image_size == (112, 112) and isinstance(s.image, str)
        assert s.boxes or (s.answer_type in ("number", "yesno") and s.answer in ("0", "no"))
    assert {s.task for s in samples} == {f"shapes/{k}" for k in KINDS}


def test_deterministic_for_a_seed(tmp_path):
    a = synth_dataset(tmp_path / "a", 20, seed=5)
    b = synth_dataset(tmp_path / "b", 20, seed=5)
    c = synth_dataset(tmp_path / "c", 20, seed=6)
    assert a["train"].read_text() == b["train"].read_text() != c["train"].read_text()
    img = json.loads(a["train"].read_text().splitlines()[0])["image"]
    digest = [hashlib.sha256((tmp_path / d / img).read_bytes()).hexdigest() for d in ("a", "b")]
    assert digest[0] == digest[1]


def test_answers_and_boxes_match_the_pixels(tmp_path):
    paths = synth_dataset(tmp_path, 60, seed=1)
    for s in load_samples(paths["train"]).samples:
        scene = s.meta["scene"]
        pixels = np.asarray(Image.open(s.image).convert("RGB")).astype(int)
        for obj in scene:  # each box is the exact extent of its coloured pixels
            x1, y1, x2, y2 = obj["box"]
            mask = np.abs(pixels[y1:y2, x1:x2] - 255).sum(-1) > 0
            ys, xs = np.nonzero(mask)
            assert (xs.min(), xs.max() + 1) == (0, x2 - x1) and ys.max() + 1 == y2 - y1
        boxes = [o["box"] for o in scene]
        for i, a in enumerate(boxes):  # no two shapes overlap
            for b in boxes[i + 1 :]:
                assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
        kind = s.task.split("/")[1]
        if kind == "count":
            colour = s.question.split()[2]
            assert s.answer == str(sum(o["colour"] == colour for o in scene))
        elif kind == "exist":
            article, *name, _, _, _ = s.question.split()[2:]  # "Is there an orange circle in the image?"
            name = " ".join(name)
            assert article == ("an" if name[0] in "aeiou" else "a")
            assert (s.answer == "yes") == (name in s.objects)
        elif kind == "ground":
            assert s.boxes[0] in boxes and json.loads(s.answer) == s.boxes[0]
        elif kind == "colour":
            shape = s.question.split()[-1].rstrip("?")
            assert [o["colour"] for o in scene if o["shape"] == shape] == [s.answer]


def test_half_the_no_existence_questions_cross_a_present_colour_with_a_present_shape():
    import random

    from vlgrpo.data.synth import Shape, _question

    scene = [Shape("circle", "red", (0, 0, 10, 10)), Shape("square", "blue", (20, 20, 30, 30))]
    rng = random.Random(0)
    asked = [_question(rng, "exist", scene, 0.5) for _ in range(4000)]
    no = [q for q, answer, *_ in asked if answer == "no"]
    crossed = [q for q in no if q in ("Is there a red square in the image?", "Is there a blue circle in the image?")]
    # 0.5 crossed by choice + 0.5 x 2/16 of the uniform draws (16 absent names, 2 of them crossed) = 0.5625
    assert 1900 < len(no) < 2100 and abs(len(crossed) / len(no) - 0.5625) < 0.03
    one = [Shape("circle", "red", (0, 0, 10, 10))]  # nothing to cross: uniform over the 17 absent names
    names = {q for q, answer, *_ in (_question(rng, "exist", one, 0.5) for _ in range(2000)) if answer == "no"}
    assert len(names) == 17


def test_only_the_train_split_crosses_and_the_test_split_draws_what_it_drew_before(tmp_path):
    from vlgrpo.data import synth

    def crossed_share(path):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        no = [r for r in rows if r["task"] == "shapes/exist" and r["answer"] == "no"]
        hit = 0
        for r in no:
            colour, shape = r["question"].split()[3:5]
            scene = r["meta"]["scene"]
            hit += any(o["colour"] == colour for o in scene) and any(o["shape"] == shape for o in scene)
        return hit / len(no)

    new = synth_dataset(tmp_path / "new", 2000, seed=2, image_size=56, max_shapes=3)
    synth.CROSSED_NEGATIVES, saved = 0.0, synth.CROSSED_NEGATIVES
    try:  # the generator as it was: uniform absent names everywhere
        old = synth_dataset(tmp_path / "old", 2000, seed=2, image_size=56, max_shapes=3)
    finally:
        synth.CROSSED_NEGATIVES = saved
    assert crossed_share(new["train"]) > 2.5 * crossed_share(old["train"])  # 0.22 against 0.07, 1-3 shapes a scene
    for split in ("val", "test"):  # byte for byte
        assert new[split].read_text() == old[split].read_text()


def _blobs(mask: np.ndarray) -> int:
    """Connected regions of a boolean mask (4-neighbour flood fill)."""
    seen, count = np.zeros_like(mask), 0
    for y, x in zip(*np.nonzero(mask)):
        if seen[y, x]:
            continue
        count, stack = count + 1, [(y, x)]
        while stack:
            cy, cx = stack.pop()
            if 0 <= cy < mask.shape[0] and 0 <= cx < mask.shape[1] and mask[cy, cx] and not seen[cy, cx]:
                seen[cy, cx] = True
                stack += [(cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)]
    return count


def test_compare_and_motion_answers_match_the_pixels(tmp_path):
    from vlgrpo.data.synth import RGB

    assert main(["data", "synth", "--out", str(tmp_path), "--n", "40", "--seed", "2", "--kinds", "compare,motion"]) == 0
    samples = load_samples(tmp_path / "train.jsonl").samples
    compare = [s for s in samples if s.task == "shapes/compare"]
    motion = [s for s in samples if s.task == "shapes/motion"]
    assert len(compare) == len(motion) == 16 and {s.answer for s in compare} == {"first", "second"}
    assert {s.answer for s in motion} == {"left", "right"}
    for s in compare:  # the shapes of the asked colour, counted as blobs of its exact RGB in each image
        colour = s.question.split()[4]  # "Which image has more red shapes, the first or the second?"
        assert s.image is None and len(s.images) == 2 and s.video is None
        counts = [_blobs((np.asarray(Image.open(p).convert("RGB")) == RGB[colour]).all(-1)) for p in s.images]
        assert counts[0] != counts[1] and s.answer == ("first" if counts[0] > counts[1] else "second")
        assert counts == s.meta["counts"]
    for s in motion:  # the circle's centre, frame by frame, from its pixels
        colour = s.question.split()[2]  # "Does the red circle move left or right?"
        assert s.image is None and s.images == [] and len(s.video.frames) == 4
        xs = [
            np.nonzero((np.asarray(Image.open(f).convert("RGB")) == RGB[colour]).all(-1))[1].mean()
            for f in s.video.frames
        ]
        steps = np.diff(xs)
        assert (steps > 0).all() if s.answer == "right" else (steps < 0).all()
        assert abs(xs[-1] - xs[0]) >= 112 - 2 * (112 // 4) - 112 // 6 - 1  # from one quarter to the other
    with pytest.raises(InputError, match="accepted: count, colour, exist, ground, compare, motion"):
        synth_dataset(tmp_path / "bad", 10, kinds=("spin",))


def test_zoom_rows_ask_about_one_cell_of_a_grid_whose_shape_the_pixels_show(tmp_path):
    from vlgrpo.data.synth import COLOURS, RGB, ZOOM_GRID

    assert main(["data", "synth", "--out", str(tmp_path), "--n", "60", "--seed", "4", "--kinds", "zoom"]) == 0
    samples = [s for split in ("train", "val", "test") for s in load_samples(tmp_path / f"{split}.jsonl").samples]
    assert len(samples) == 60 and {s.task for s in samples} == {"shapes/zoom"}
    cells, side = set(), 224  # cells of 2 x the 112 px default
    for s in samples:
        pixels = np.asarray(Image.open(s.image).convert("RGB")).astype(int)
        assert pixels.shape == (896, 896, 3) and s.image_size == (896, 896) and ZOOM_GRID == 4
        assert (s.answer_type, s.objects) == ("text", []) and s.answer in COLOURS
        r, c = s.meta["cell"]
        assert s.question == f"What colour is the shape in row {r}, column {c}?"
        assert s.boxes == [[(c - 1) * side, (r - 1) * side, c * side, r * side]]  # the cell: where to look
        x1, y1, x2, y2 = s.meta["target"]  # the shape: 14 px (112 // 8), whole inside its cell
        assert (x2 - x1, y2 - y1) == (14, 14)
        assert (c - 1) * side <= x1 and x2 <= c * side and (r - 1) * side <= y1 and y2 <= r * side
        assert tuple(pixels[(y1 + y2) // 2, (x1 + x2) // 2]) == RGB[s.answer]  # the answer is drawn at its centre
        for k in range(ZOOM_GRID * ZOOM_GRID):  # every cell holds a shape of its own: ink in each
            cy, cx = divmod(k, ZOOM_GRID)
            cell = pixels[cy * side : (cy + 1) * side, cx * side : (cx + 1) * side]
            assert (cell != 255).any()
        cells.add((r, c))
    assert len(cells) >= 14  # the questions spread over the grid


def test_the_zoom_shape_is_a_few_pixels_after_the_tiny_bases_resize_and_whole_in_a_cells_crop():
    """The tiny base's processor (max_pixels 224 x 224) squeezes an 896 px zoom image 4x: its 14 px shapes keep ~3.5
    px, a quarter of a 14 px patch; a 224 px cell's crop comes back unsqueezed."""
    from pathlib import Path

    from vlgrpo.data.images import checkpoint_geometry

    base = Path(__file__).resolve().parents[2] / "data" / "models" / "shapes-tiny-qwen2_5_vl"
    geometry, _ = checkpoint_geometry(str(base))
    assert geometry.resized_hw(896, 896) == (224, 224) and geometry.num_image_tokens(896, 896) == 64
    assert geometry.resized_hw(224, 224) == (224, 224)


def test_the_default_kinds_write_byte_for_byte_what_they_wrote_before_zoom(tmp_path):
    """Zoom draws from the random stream only on its own rows: the default data (and so the demo's pinned figures)
    are unchanged. The digests are of the JSONL, which holds no encoder output (only boxes, names and paths)."""
    paths = synth_dataset(tmp_path, 50, seed=0)
    digests = {split: hashlib.sha256(path.read_bytes()).hexdigest()[:16] for split, path in paths.items()}
    assert digests == {"train": "2aa2fec37464552a", "val": "d48f3a7a80db64d0", "test": "5bfde610547db807"}


def test_the_demo_selects_the_zoom_kind(tmp_path, monkeypatch):
    """`vlgrpo demo --kinds count,zoom` hands the kinds to the data synthesis; zoom is scored by the VQA suite and adds
    no POPE of its own; the default demo keeps its four kinds."""
    import vlgrpo.demo.run as demo

    seen = []
    monkeypatch.setattr(demo, "run_demo", lambda out, settings: seen.append(settings))
    assert main(["demo", "--out", str(tmp_path / "d"), "--kinds", "count,zoom"]) == 0
    assert seen == [demo.DemoSettings(kinds=("count", "zoom"))] and demo.DemoSettings().kinds == KINDS
    assert demo.demo_suites(("zoom",)) == ["vqa"] and demo.demo_suites(("count", "zoom")) == ["vqa", "pope"]
    grpo = demo.stage_config(seen[0], tmp_path, "grpo", tmp_path / "sft_model")
    assert grpo.eval.suites == ["vqa"] and "iou" not in grpo.reward.recipe
