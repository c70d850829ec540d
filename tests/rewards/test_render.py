import random

from vlgrpo.data.synth import Shape, make_sample, scene_names
from vlgrpo.rewards.render import render_completion
from vlgrpo.trainer.sft import render_target
from vlgrpo.types import Sample


def _sample(**kw) -> Sample:
    fields = {"id": "s", "image": "x.png", "question": "Is there a red circle in the image?", "answer": "no",
              "answer_type": "yesno", "image_size": (112, 112)}  # fmt: skip
    return Sample(**{**fields, **kw})


def test_think_answer_thinks_with_the_samples_own_reasoning_when_it_has_one():
    plain = _sample()
    assert render_completion(plain, "think_answer", "qwen2_5") == (
        "<think>I check whether the object is in the image.</think><answer>no</answer>")
    reasoned = _sample(meta={"reasoning": "blue square, orange triangle"})
    assert render_completion(reasoned, "think_answer", "qwen2_5") == (
        "<think>blue square, orange triangle</think><answer>no</answer>")
    assert render_completion(reasoned, "answer", "qwen2_5") == "<answer>no</answer>"  # no think part to fill
    assert render_target(reasoned, "think_answer", "qwen2_5") == render_completion(reasoned, "think_answer", "qwen2_5")


def test_scene_names_order_colour_then_shape_and_keep_duplicates():
    shapes = [Shape("square", "orange", (0, 0, 1, 1)), Shape("circle", "blue", (0, 0, 1, 1)),
              Shape("triangle", "red", (0, 0, 1, 1)), Shape("circle", "red", (0, 0, 1, 1)),
              Shape("circle", "blue", (0, 0, 1, 1))]  # fmt: skip
    # COLOURS order red, green, blue, yellow, purple, orange; SHAPES order circle, square, triangle
    assert scene_names(shapes) == "red circle, red triangle, blue circle, blue circle, orange square"


def test_a_synthetic_samples_reasoning_lists_its_scene(tmp_path):
    sample = make_sample(random.Random(3), 0, 112, ("ground",), tmp_path, "train", 3)
    scene = [Shape(o["shape"], o["colour"], tuple(o["box"])) for o in sample.meta["scene"]]
    assert sample.meta["reasoning"] == scene_names(scene) and len(scene) >= 1
    target = render_target(sample, "think_answer", "qwen2_5")
    assert target.startswith(f"<think>{scene_names(scene)}</think><answer>[{{\"bbox_2d\": ")
