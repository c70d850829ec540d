"""The synthetic "shapes" task: Pillow scenes of coloured shapes with verifiable questions and exact boxes.

Four question kinds on one image: count (number), colour (text), existence (yes/no) and grounding (box); three more
on request: compare (two images: which has more shapes of a colour), motion (a video of frames: which way a circle
moves) and zoom (the colour of a small shape in one named cell of an 8x larger image: a question a crop answers).
Deterministic for a seed; writes PNG files and train/val/test JSONL in the `Sample` schema. Knows nothing of models.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from vlgrpo.types import InputError, Sample, Video

SHAPES = ("circle", "square", "triangle")
COLOURS = ("red", "green", "blue", "yellow", "purple", "orange")
RGB = {
    "red": (220, 30, 30),
    "green": (30, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 205, 20),
    "purple": (140, 50, 170),
    "orange": (245, 130, 20),
}
KINDS = ("count", "colour", "exist", "ground")
"""The default question kinds, one image each."""
MORE_KINDS = ("compare", "motion", "zoom")
"""Kinds chosen with --kinds: compare (two images, text answer first / second), motion (a video of MOTION_FRAMES
frame PNGs, text answer left / right) and zoom (a grid of cells with a small shape each, text answer a colour)."""
ZOOM_GRID = 4
"""A zoom image is ZOOM_GRID x ZOOM_GRID cells of 2 x --image-size px (896 px at the demo's 112): `zoom_sample`."""
MOTION_FRAMES = 4
"""Frames of a motion video: Qwen's fewest (qwen-vl-utils' FPS_MIN_FRAMES), two temporal patches."""
CROSSED_NEGATIVES = 0.5
"""In the train split, the share of "no" existence questions, on scenes that allow one, that name a present colour
with a present shape of another colour ("a blue circle" beside a blue square and a red circle): the binding error
POPE's 3-object scenes catch. Uniform absent names alone made them 0.07 of the demo's "no" questions, and a
model that had not learnt to bind colour to shape said "yes" to them (seed 3: 6 of 6 in the test split, POPE
yes-ratio 0.68). The val and test splits keep uniform absent names (and draw exactly what they drew before), so an
evaluation measures the task, not the training recipe; POPE measures the binding."""
SPLITS = (("train", 0.8), ("val", 0.1), ("test", 0.1))


@dataclass
class Shape:
    shape: str
    colour: str
    box: tuple[int, int, int, int]
    """Exact pixel bounding box of the drawn shape, xyxy, inclusive-exclusive like PIL."""

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


def scene_names(shapes: list[Shape]) -> str:
    """The objects without positions, ordered by colour then shape (COLOURS, SHAPES order), e.g. "blue square, red
    circle": the name list the shipped base was pretrained to write. A sample's `meta.reasoning` is the list of the
    shapes its question is about ("none" when there are none): a `think_answer` cold start thinks by listing them."""
    ordered = sorted(shapes, key=lambda s: (COLOURS.index(s.colour), SHAPES.index(s.shape)))
    return ", ".join(s.name for s in ordered)


def _place(rng: random.Random, n: int, size: int, smin: int, smax: int) -> list[tuple[int, int, int, int]]:
    """Up to n non-overlapping square slots (2 px apart) by rejection sampling."""
    boxes: list[tuple[int, int, int, int]] = []
    for _ in range(200 * n):
        if len(boxes) == n:
            break
        s = rng.randint(smin, smax)
        x, y = rng.randint(1, size - s - 1), rng.randint(1, size - s - 1)
        cand = (x, y, x + s, y + s)
        if all(cand[2] + 2 <= b[0] or b[2] + 2 <= cand[0] or cand[3] + 2 <= b[1] or b[3] + 2 <= cand[1] for b in boxes):
            boxes.append(cand)
    return boxes


def draw_scene(rng: random.Random, size: int, max_shapes: int = 6) -> tuple[Image.Image, list[Shape]]:
    """A white canvas with 1..max_shapes non-overlapping shapes; returns the image and the exact shapes."""
    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    smin, smax = max(10, size // 8), max(14, size // 4)
    shapes = []
    for box in _place(rng, rng.randint(1, max_shapes), size, smin, smax):
        shapes.append(Shape(rng.choice(SHAPES), rng.choice(COLOURS), box))
        _draw(draw, shapes[-1])
    return img, shapes


def _draw(draw: ImageDraw.ImageDraw, s: Shape) -> None:
    x1, y1, x2, y2 = s.box
    if s.shape == "circle":
        draw.ellipse((x1, y1, x2 - 1, y2 - 1), fill=RGB[s.colour])
    elif s.shape == "square":
        draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=RGB[s.colour])
    else:
        draw.polygon([((x1 + x2 - 1) / 2, y1), (x1, y2 - 1), (x2 - 1, y2 - 1)], fill=RGB[s.colour])


def _listed(shapes: list[Shape]) -> list[dict]:
    return [{"shape": s.shape, "colour": s.colour, "box": list(s.box)} for s in shapes]


def _question(
    rng: random.Random, kind: str, shapes: list[Shape], crossed: float = 0.0
) -> tuple[str, str | None, str, list, list] | None:
    """(question, answer, answer_type, gold boxes, the shapes the question is about) for one kind, or None when the
    scene cannot pose it. The shapes it is about: those of the asked colour (count, ground), kind (colour) or name
    (exist: the answer is then "yes" unless the list is "none"). Half the existence questions are "no"; of those,
    the share `crossed` cross a present colour with a present shape where the scene allows (0: uniform absent names,
    and the random stream is consumed as if the option did not exist)."""
    if kind == "count":
        colour = rng.choice([s.colour for s in shapes] + [rng.choice(COLOURS)])
        hits = [s for s in shapes if s.colour == colour]
        return f"How many {colour} shapes are there?", str(len(hits)), "number", [list(s.box) for s in hits], hits
    if kind == "colour":
        unique = [s for s in shapes if sum(t.shape == s.shape for t in shapes) == 1]
        if not unique:
            return None
        s = rng.choice(unique)
        return f"What colour is the {s.shape}?", s.colour, "text", [list(s.box)], [s]
    if kind == "exist":
        present = {s.name for s in shapes}
        if rng.random() < 0.5:
            name = rng.choice(sorted(present))
        else:
            absent = [f"{c} {k}" for c in COLOURS for k in SHAPES if f"{c} {k}" not in present]
            colours, kinds = {s.colour for s in shapes}, {s.shape for s in shapes}
            crossing = [n for n in absent if n.split()[0] in colours and n.split()[1] in kinds]
            name = rng.choice(crossing if crossed and crossing and rng.random() < crossed else absent)
        hits = [s for s in shapes if s.name == name]  # about: the shapes of that name, so "none" reads as "no"
        article = "an" if name[0] in "aeiou" else "a"  # "an orange circle", as POPE asks
        return (
            f"Is there {article} {name} in the image?",
            "yes" if hits else "no",
            "yesno",
            [list(s.box) for s in hits],
            hits,
        )
    unique = [s for s in shapes if sum(t.name == s.name for t in shapes) == 1]
    if not unique:
        return None
    s = rng.choice(unique)
    about = [t for t in shapes if t.colour == s.colour]
    return f"Locate the {s.name}.", json.dumps(list(s.box)), "box", [list(s.box)], about


def make_sample(
    rng: random.Random, idx: int, size: int, kinds: tuple[str, ...], image_dir: Path, split: str, max_shapes: int = 6
) -> Sample:
    """Draw one scene, pose one question of a kind chosen round-robin, save the PNG; returns the Sample. The train
    split's "no" existence questions cross colours and shapes (`CROSSED_NEGATIVES`); other splits' do not."""
    kind = kinds[idx % len(kinds)]
    if kind == "compare":
        return compare_sample(rng, f"shapes-{split}-{idx:06d}", size, image_dir, split, max_shapes)
    if kind == "motion":
        return motion_sample(rng, f"shapes-{split}-{idx:06d}", size, image_dir, split)
    if kind == "zoom":
        return zoom_sample(rng, f"shapes-{split}-{idx:06d}", size, image_dir, split)
    while True:
        img, shapes = draw_scene(rng, size, max_shapes)
        q = _question(rng, kind, shapes, CROSSED_NEGATIVES if split == "train" else 0.0)
        if q is not None:
            break
    question, answer, answer_type, boxes, about = q
    sid = f"shapes-{split}-{idx:06d}"
    img.save(image_dir / f"{sid}.png")
    return Sample(
        id=sid,
        image=f"images/{sid}.png",
        question=question,
        answer=answer,
        answer_type=answer_type,
        boxes=boxes,
        objects=sorted({s.name for s in shapes}),
        image_size=(size, size),
        task=f"shapes/{kind}",
        meta={"split": split, "scene": _listed(shapes), "reasoning": scene_names(about) or "none"},
    )


def compare_sample(rng: random.Random, sid: str, size: int, image_dir: Path, split: str, max_shapes: int) -> Sample:
    """Two scenes and "Which image has more {colour} shapes, the first or the second?", the colour one of theirs and
    the two counts different (pairs are drawn until they are); answer "first" or "second"."""
    while True:
        scenes = [draw_scene(rng, size, max_shapes) for _ in range(2)]
        colour = rng.choice(sorted({s.colour for _, shapes in scenes for s in shapes}))
        counts = [sum(s.colour == colour for s in shapes) for _, shapes in scenes]
        if counts[0] != counts[1]:
            break
    for i, (img, _) in enumerate(scenes):
        img.save(image_dir / f"{sid}-{i}.png")
    about = [scene_names([s for s in shapes if s.colour == colour]) or "none" for _, shapes in scenes]
    return Sample(
        id=sid,
        images=[f"images/{sid}-{i}.png" for i in range(2)],
        question=f"Which image has more {colour} shapes, the first or the second?",
        answer="first" if counts[0] > counts[1] else "second",
        answer_type="text",
        task="shapes/compare",
        meta={
            "split": split,
            "scenes": [_listed(shapes) for _, shapes in scenes],
            "counts": counts,
            "reasoning": f"first: {about[0]}; second: {about[1]}",
        },
    )


def motion_sample(rng: random.Random, sid: str, size: int, image_dir: Path, split: str) -> Sample:
    """A video of MOTION_FRAMES frames in which a circle of one colour moves at a constant speed from the left quarter
    of the frame to the right quarter, or back, among still shapes of other colours above or below its path; "Does the
    {colour} circle move left or right?", answer "left" or "right"."""
    d = max(10, size // 6)
    colour, direction = rng.choice(COLOURS), rng.choice(("left", "right"))
    y = rng.randint(1, size - d - 1)
    ends = [rng.randint(1, size // 4), rng.randint(size - d - 1 - size // 4, size - d - 1)]
    start, end = ends if direction == "right" else ends[::-1]
    xs = [round(start + (end - start) * k / (MOTION_FRAMES - 1)) for k in range(MOTION_FRAMES)]
    still = [
        Shape(rng.choice(SHAPES), rng.choice([c for c in COLOURS if c != colour]), box)
        for box in _place(rng, 3, size, max(10, size // 8), max(14, size // 5))
        if box[3] + 2 <= y or y + d + 2 <= box[1]
    ]
    track = [Shape("circle", colour, (x, y, x + d, y + d)) for x in xs]
    for k, moving in enumerate(track):
        img = Image.new("RGB", (size, size), (255, 255, 255))
        draw = ImageDraw.Draw(img)
        for s in [*still, moving]:
            _draw(draw, s)
        img.save(image_dir / f"{sid}-f{k}.png")
    return Sample(
        id=sid,
        video=Video(frames=[f"images/{sid}-f{k}.png" for k in range(MOTION_FRAMES)]),
        question=f"Does the {colour} circle move left or right?",
        answer=direction,
        answer_type="text",
        task="shapes/motion",
        meta={
            "split": split,
            "track": [list(s.box) for s in track],
            "scene": _listed(still),
            "reasoning": f"{colour} circle at x {xs[0]}, then x {xs[-1]}",
        },
    )


def zoom_sample(rng: random.Random, sid: str, size: int, image_dir: Path, split: str) -> Sample:
    """A ZOOM_GRID x ZOOM_GRID grid of cells, each 2 x `size` px, one small shape (`size` // 8 px, at least 4) in
    each, somewhere inside its cell; "What colour is the shape in row {r}, column {c}?", answer its colour (text).
    `boxes` holds the cell (original pixels): where to look, the gold call's box; `meta.target` the shape's own box,
    so a crop can be checked for it.

    Built so that the tool is needed and a 2 M-parameter model can learn to use it. At the demo's 112 px: an 896 px
    image of 224 px cells and 14 px shapes. The tiny base's processor (max_pixels 224 x 224) squeezes the whole image
    4x: a shape becomes ~3.5 px, ~2 % of its 28 px token among 16 such shapes (`dev/LOG.md` measures what a model
    reads there). A crop of one cell comes back at 224 px, unsqueezed: the shape 14 px across, the smallest size the
    base was pretrained on, and alone. Where to look is coarse (a cell out of 16, named in words, the same box for every
    row that names it), so the call is learnable from the question alone. Qwen2.5-VL's released processor (max_pixels
    12.8 M) keeps 896 px whole; set model.max_pixels (e.g. 224 * 224) for the same squeeze."""
    cell, side = 2 * size, max(4, size // 8)
    big = ZOOM_GRID * cell
    img = Image.new("RGB", (big, big), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    shapes = []
    for r in range(ZOOM_GRID):
        for c in range(ZOOM_GRID):  # inside the cell with a margin of half a shape: a crop of the cell holds it whole
            x = rng.randint(c * cell + side // 2, (c + 1) * cell - side - side // 2)
            y = rng.randint(r * cell + side // 2, (r + 1) * cell - side - side // 2)
            shapes.append(Shape(rng.choice(SHAPES), rng.choice(COLOURS), (x, y, x + side, y + side)))
    for s in shapes:
        _draw(draw, s)
    k = rng.randrange(ZOOM_GRID * ZOOM_GRID)
    (r, c), target = divmod(k, ZOOM_GRID), shapes[k]
    img.save(image_dir / f"{sid}.png")
    return Sample(
        id=sid,
        image=f"images/{sid}.png",
        question=f"What colour is the shape in row {r + 1}, column {c + 1}?",
        answer=target.colour,
        answer_type="text",
        boxes=[[c * cell, r * cell, (c + 1) * cell, (r + 1) * cell]],
        image_size=(big, big),
        task="shapes/zoom",
        meta={"split": split, "target": list(target.box), "cell": [r + 1, c + 1], "reasoning": target.name},
    )


def synth_dataset(
    out_dir: str | Path,
    n: int,
    seed: int = 0,
    image_size: int = 112,
    kinds: tuple[str, ...] = KINDS,
    max_shapes: int = 6,
) -> dict[str, Path]:
    """Write n samples split 80/10/10 into out_dir/{train,val,test}.jsonl + out_dir/images/*.png (compare: two PNGs
    per sample, motion: MOTION_FRAMES frame PNGs)."""
    if not 1 <= max_shapes <= 6:
        raise InputError(f"--max-shapes must be between 1 and 6, got {max_shapes}")
    bad = [k for k in kinds if k not in KINDS + MORE_KINDS]
    if bad or not kinds:
        raise InputError(f"--kinds: unknown question kinds {bad}; accepted: {', '.join(KINDS + MORE_KINDS)}")
    if n < 1 or image_size < 56:
        raise InputError(f"need n >= 1 and image_size >= 56 px (got n={n}, image_size={image_size})")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    counts, start = {}, 0
    for i, (split, frac) in enumerate(SPLITS):
        counts[split] = n - start if i == len(SPLITS) - 1 else int(round(n * frac))
        start += counts[split]
    paths = {}
    for split_no, (split, _) in enumerate(SPLITS):
        rng = random.Random(seed * 1000 + split_no)  # each split has its own stream: sizes change nothing else
        path = out / f"{split}.jsonl"
        with path.open("w") as f:
            for idx in range(counts[split]):
                sample = make_sample(rng, idx, image_size, kinds, out / "images", split, max_shapes)
                f.write(json.dumps(sample.to_dict()) + "\n")
        paths[split] = path
    return paths
