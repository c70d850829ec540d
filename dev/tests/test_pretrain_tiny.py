"""dev/pretrain_tiny.py: captions in the model's box convention, their scoring, the training rows, and that one
command rebuilds the same weights."""

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest
import torch

from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.data.synth import Shape, draw_scene
from vlgrpo.models import load_model

SCRIPT = Path(__file__).resolve().parents[1] / "pretrain_tiny.py"


@pytest.fixture(scope="module")
def pt():
    spec = importlib.util.spec_from_file_location("pretrain_tiny", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["pretrain_tiny"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_caption_lists_objects_left_to_right_in_resized_pixels(pt):
    shapes = [Shape("circle", "red", (60, 10, 80, 30)), Shape("square", "blue", (5, 50, 25, 70))]
    geometry = ProcessorGeometry(min_pixels=56 * 56, max_pixels=224 * 224)
    assert json.loads(pt.caption(shapes, 112, geometry)) == [
        {"bbox_2d": [5, 50, 25, 70], "label": "blue square"},  # 112 px is a multiple of 28: no resize
        {"bbox_2d": [60, 10, 80, 30], "label": "red circle"},
    ]
    # 100 px is resized to 112 by smart_resize: Qwen2.5-VL boxes are in the resized input's pixels (x 1.12)
    assert json.loads(pt.caption(shapes, 100, geometry))[0]["bbox_2d"] == [6, 56, 28, 78]


def test_name_lists_ignore_position(pt):
    shapes = [
        Shape("circle", "red", (60, 10, 80, 30)),
        Shape("square", "blue", (5, 50, 25, 70)),
        Shape("circle", "blue", (30, 30, 50, 50)),
    ]
    assert pt.names(shapes) == "red circle, blue circle, blue square"  # COLOURS order, then SHAPES order
    assert pt.names(shapes[::-1]) == pt.names(shapes)


def test_a_gold_caption_scores_one_and_each_error_costs_its_metric(pt):
    geometry = ProcessorGeometry(min_pixels=56 * 56, max_pixels=224 * 224)
    shapes = [Shape("circle", "red", (60, 10, 80, 30)), Shape("square", "blue", (5, 50, 25, 70))]
    gold = pt.caption(shapes, 100, geometry)
    assert set(pt.score_caption(gold, shapes, 100, geometry).values()) == {1.0}
    wrong_colour = gold.replace("blue square", "green square")
    v = pt.score_caption(wrong_colour, shapes, 100, geometry)
    assert (v["first_colour"], v["first_shape"], v["count"], v["all_objects"]) == (0.0, 1.0, 1.0, 0.0)
    assert (v["box_iou50"], v["object_iou50"]) == (1.0, 0.5)  # the box still matches; the named object does not
    one = json.dumps(json.loads(gold)[:1])
    v = pt.score_caption(one, shapes, 100, geometry)
    assert (v["count"], v["box_iou50"], v["first_shape"]) == (0.0, 0.5, 1.0)
    assert pt.score_caption("no boxes here", shapes, 100, geometry)["parsed"] == 0.0


def test_training_rows_match_the_processor_and_label_only_the_caption(pt, tiny_model_dir):
    lm = load_model(tiny_model_dir("qwen2_5_vl"))
    geometry = ProcessorGeometry.from_processor(lm.processor)
    img, shapes = draw_scene(random.Random(5), 112, 3)
    target = pt.caption(shapes, 112, geometry)
    prompt = pt.prompt_ids(lm.processor, geometry, 112)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": pt.CAPTION_PROMPT}]}]
    text = lm.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == lm.processor(text=[text], images=[img])["input_ids"][0]
    batch = pt.encode(lm.processor, [prompt, prompt], [img, img], [target, "[]"])
    tok = lm.processor.tokenizer
    labelled = batch["labels"][0][batch["labels"][0] != -100].tolist()
    assert tok.decode(labelled) == target + "<|im_end|>"
    assert int(batch["mm_token_type_ids"][0].sum()) == 16
    assert batch["attention_mask"][1].sum() == len(prompt) + len(tok("[]")["input_ids"]) + 1  # right padding


def test_one_command_rebuilds_the_same_weights_and_a_saved_stage_2_gives_the_same_model(pt, tmp_path):
    args = [
        "--stage0-steps",
        "2",
        "--stage1-steps",
        "2",
        "--stage2-steps",
        "2",
        "--eval-scenes",
        "4",
        "--eval-every",
        "0",
        "--zero-shot-questions",
        "20",
        "--spec",
        '{"num_layers": 1, "vision_depth": 1}',
    ]
    assert pt.main(["--out", str(tmp_path / "a"), *args, "--stage3-steps", "3"]) == 0
    assert pt.main(["--out", str(tmp_path / "s2"), *args, "--stage3-steps", "0"]) == 0  # stages 0-2 only
    assert (
        pt.main(["--out", str(tmp_path / "c"), *args, "--stage3-steps", "3", "--from-stage2", str(tmp_path / "s2")])
        == 0
    )
    a, s2, c = (json.loads((tmp_path / n / "pretrain.json").read_text()) for n in ("a", "s2", "c"))
    assert a["stage2"]["weights_sha256"] == s2["stage2"]["weights_sha256"] == s2["weights_sha256"]  # rebuilt alike
    assert a["weights_sha256"] == c["weights_sha256"] != a["stage2"]["weights_sha256"]  # stage 3 changed the weights
    assert a["loss_log"] == c["loss_log"] and a["caption_quality"] == c["caption_quality"]
    assert a["instructions"] == c["instructions"] and set(a["instructions"]) == {
        "list_colour",
        "list_colour_none",
        "list_shape",
        "list_shape_none",
        "list_name",
        "list_name_none",
        "find_name",
        "find_name_none",
    }
    assert [e["stage3_step"] for e in a["loss_log"] if "stage3_step" in e] == [3]
    card = (tmp_path / "a" / "README.md").read_text()
    assert card.startswith("# a\n") and a["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert f"CPU kernels {a['cpu_capability']}." in card  # the weights' bits depend on them (docs/demo-seeds.md)
    lm = load_model(str(tmp_path / "a"))
    assert lm.arch == "qwen2_5_vl" and lm.processor.tokenizer.chat_template
    rope = lm.model.config.get_text_config().rope_parameters  # default_spec's base reaches the saved config
    assert rope["rope_theta"] == pt.default_spec().rope_theta == 10.0 and rope["mrope_section"] == [4, 6, 6]
    old = json.loads((tmp_path / "s2" / "pretrain.json").read_text())
    del old["settings"]["pad_sentences"]  # a build from before the setting existed (the shipped one): its default
    del old["settings"]["spec"]["tie_word_embeddings"]  # the same for a TinySpec field
    (tmp_path / "s2" / "pretrain.json").write_text(json.dumps(old))
    assert (
        pt.main(["--out", str(tmp_path / "f"), *args, "--stage3-steps", "3", "--from-stage2", str(tmp_path / "s2")])
        == 0
    )
    assert json.loads((tmp_path / "f" / "pretrain.json").read_text())["weights_sha256"] == a["weights_sha256"]
    with pytest.raises(SystemExit, match="stage 0-2 settings differ from this command's in \\['stage1_steps'\\]"):
        pt.main(
            [
                "--out",
                str(tmp_path / "d"),
                *args[:2],
                "--stage1-steps",
                "3",
                *args[4:],
                "--from-stage2",
                str(tmp_path / "s2"),
            ]
        )
    with pytest.raises(SystemExit, match="is not the stage-2 model"):  # a holds stage 3
        pt.main(["--out", str(tmp_path / "e"), *args, "--from-stage2", str(tmp_path / "a")])


def test_stage_3_lists_and_finds_the_asked_colour_kind_or_name_and_says_none_when_absent(pt):
    geometry = ProcessorGeometry(min_pixels=56 * 56, max_pixels=224 * 224)
    shapes = [
        Shape("circle", "red", (60, 10, 80, 30)),
        Shape("square", "blue", (5, 50, 25, 70)),
        Shape("circle", "blue", (30, 30, 50, 50)),
    ]
    rows = {
        pt.instruct_row(task, random.Random(seed), shapes, 112, geometry)
        for task in (*pt.LIST_TASKS, pt.FIND_TASK)
        for seed in range(60)
    }
    assert ("List the blue shapes.", "blue circle, blue square") in rows
    assert ("List each circle.", "red circle, blue circle") in rows  # the singular key, as the demo asks
    assert ("List each triangle.", "none") in rows and ("List the green shapes.", "none") in rows
    assert ("List each red circle.", "red circle") in rows and ("List each blue square.", "blue square") in rows
    assert {a for q, a in rows if q == "List each blue circle."} == {"blue circle"}
    assert any(q.startswith("List each ") and q.count(" ") == 3 and a == "none" for q, a in rows)  # an absent name
    # find: the asked shapes' grounding JSON (boxes in resized pixels, as the caption writes them), or none
    finds = {q: a for q, a in rows if q.startswith("Find each ")}
    assert finds["Find each blue square."] == pt.caption([shapes[1]], 112, geometry)
    assert json.loads(finds["Find each red circle."]) == [{"bbox_2d": [60, 10, 80, 30], "label": "red circle"}]
    assert "none" in finds.values() and all(q[10:-1] in pt.NAMES_ALL for q in finds)
    demo_templates = ("How many", "What colour", "Is there", "Locate")
    assert not any(q.startswith(demo_templates) for q, _ in rows)
    assert pt.instruct_row("names", random.Random(0), shapes, 112, geometry) == (pt.NAMES_PROMPT, pt.names(shapes))


def test_varied_stage_3_rows_paraphrase_pad_and_wrap_without_the_demo_templates(pt):
    geometry = ProcessorGeometry(min_pixels=56 * 56, max_pixels=224 * 224)
    shapes = [Shape("circle", "red", (60, 10, 80, 30)), Shape("square", "blue", (5, 50, 25, 70))]
    rng = random.Random(0)
    rows = [
        (task, *pt.instruct_row(task, rng, shapes, 112, geometry, vary=True))
        for task in ("boxes", "names", *pt.LIST_TASKS, pt.FIND_TASK)
        for _ in range(200)
    ]
    demo_templates = ("How many", "What colour", "Is there", "Locate", "<think>", "<answer>")
    assert not any(t in q or t in a for _, q, a in rows for t in demo_templates)
    finds = [(q, a) for task, q, a in rows if task == pt.FIND_TASK]
    red = json.dumps([{"bbox_2d": [60, 10, 80, 30], "label": "red circle"}])
    # every phrase, the plain target, the tagged one and the names-then-target one all occur
    assert {q.split(" red circle")[0] for q, a in finds if "red circle" in q} >= {
        p.split(" {}")[0] for p in pt.PHRASES["Find each {}."]
    }
    plain = {a for q, a in finds if q.startswith("Find each red circle.") and "<" not in q}
    assert plain == {red}
    tagged = [(q, a) for q, a in finds if "red circle" in q and "Write it inside <" in q]
    tag = tagged[0][0].split("Write it inside <")[1].split(">")[0]
    assert tagged[0][1] == f"<{tag}>{red}</{tag}>"
    both = [(q, a) for q, a in finds if q.startswith("Find each red circle.") and "Name them inside <" in q]
    t1 = both[0][0].split("Name them inside <")[1].split(">")[0]
    t2 = both[0][0].split("write it inside <")[1].split(">")[0]
    assert both[0][1] == f"<{t1}>red circle</{t1}><{t2}>{red}</{t2}>" and t1 != t2
    fillers = [sum(f in q for f in pt.FILLERS) for _, q, _ in rows]
    assert set(fillers) == {0, 1, 2, 3}


def test_model_card_keeps_the_base_10_reason_for_the_default_split(pt):
    from pretrain_card import model_card

    shipped = json.loads(
        (
            Path(pt.__file__).resolve().parents[1] / "data" / "models" / "shapes-tiny-qwen2_5_vl" / "pretrain.json"
        ).read_text()
    )
    line = next(x for x in model_card("m", shipped).splitlines() if "M-RoPE" in x)
    assert line.endswith(
        "LM M-RoPE base 10 (not 10,000: at 10,000 the width axis of the 4 x 4 image-token grid gets "
        "frequencies under 0.004 rad per token, too low to tell its columns apart; `default_spec` in "
        "dev/pretrain_tiny.py)."
    )
    shipped["settings"]["spec"].update(rope_theta=10000.0)
    line = next(x for x in model_card("m", shipped).splitlines() if "M-RoPE" in x)
    assert line.endswith("LM M-RoPE base 10000.")
