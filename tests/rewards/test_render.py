import random

from vlgrpo.data.synth import Shape, make_sample, scene_names
from vlgrpo.rewards.render import render_completion
from vlgrpo.trainer.sft import render_target
from vlgrpo.types import Sample


def _sample(**kw) -> Sample:
    fields = {
        "id": "s",
        "image": "x.png",
        "question": "Is there a red circle in the image?",
        "answer": "no",
        "answer_type": "yesno",
        "image_size": (112, 112),
    }
    return Sample(**{**fields, **kw})


def test_think_answer_thinks_with_the_samples_own_reasoning_when_it_has_one():
    plain = _sample()
    assert render_completion(plain, "think_answer", "qwen2_5") == (
        "<think>I check whether the object is in the image.</think><answer>no</answer>"
    )
    reasoned = _sample(meta={"reasoning": "blue square, orange triangle"})
    assert render_completion(reasoned, "think_answer", "qwen2_5") == (
        "<think>blue square, orange triangle</think><answer>no</answer>"
    )
    assert render_completion(reasoned, "answer", "qwen2_5") == "<answer>no</answer>"  # no think part to fill
    assert render_target(reasoned, "think_answer", "qwen2_5") == render_completion(reasoned, "think_answer", "qwen2_5")


def test_scene_names_order_colour_then_shape_and_keep_duplicates():
    shapes = [
        Shape("square", "orange", (0, 0, 1, 1)),
        Shape("circle", "blue", (0, 0, 1, 1)),
        Shape("triangle", "red", (0, 0, 1, 1)),
        Shape("circle", "red", (0, 0, 1, 1)),
        Shape("circle", "blue", (0, 0, 1, 1)),
    ]
    # COLOURS order red, green, blue, yellow, purple, orange; SHAPES order circle, square, triangle
    assert scene_names(shapes) == "red circle, red triangle, blue circle, blue circle, orange square"


def _about(sample) -> str:
    """The shapes a synthetic question is about, worked out here from its scene and question text."""
    scene = [Shape(o["shape"], o["colour"], tuple(o["box"])) for o in sample.meta["scene"]]
    words = sample.question.rstrip("?.").split()
    if sample.task == "shapes/colour":  # "What colour is the circle": that kind
        about = [s for s in scene if s.shape == words[-1]]
    elif sample.task == "shapes/exist":  # "Is there a red circle in the image": red circles
        colour, kind = words[3:5]
        about = [s for s in scene if (s.colour, s.shape) == (colour, kind)]
    else:  # count "How many red shapes", ground "Locate the red circle": that colour
        colour = next(w for w in words if w in ("red", "green", "blue", "yellow", "purple", "orange"))
        about = [s for s in scene if s.colour == colour]
    return scene_names(about) or "none"


def test_a_synthetic_samples_reasoning_lists_the_shapes_its_question_is_about(tmp_path):
    rng, seen = random.Random(3), set()
    for i in range(40):
        sample = make_sample(rng, i, 112, ("count", "colour", "exist", "ground"), tmp_path, "train", 3)
        assert sample.meta["reasoning"] == _about(sample), sample.question
        seen.add((sample.task, sample.meta["reasoning"] == "none"))
    assert {
        ("shapes/count", True),
        ("shapes/count", False),
        ("shapes/exist", True),
        ("shapes/exist", False),
        ("shapes/colour", False),
        ("shapes/ground", False),
    } <= seen  # every kind, and "none" where it can be
    target = render_target(sample, "think_answer", "qwen2_5")  # the last one is a box question
    assert target.startswith(f'<think>{_about(sample)}</think><answer>[{{"bbox_2d": ')
