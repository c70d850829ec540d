"""Presets on small files written by hand in each project's published format (the source is cited above each test)."""

import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from vlgrpo.cli import main
from vlgrpo.config import CHOICES, ConfigError, load_config
from vlgrpo.data.adapters import load_samples
from vlgrpo.data.preset_fields import RowSkipped, infer_answer
from vlgrpo.data.presets import PRESETS, matching_presets, parse_columns
from vlgrpo.data.schema import FIELDS, DataError
from vlgrpo.types import InputError


def _image(path, size=(200, 100), fmt="JPEG"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (200, 30, 30)).save(path, format=fmt)
    return path


def _png(size=(200, 100)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (0, 90, 200)).save(buf, format="PNG")
    return buf.getvalue()


def _skipped(result) -> dict[int, str]:
    return {e.row: e.reason for e in result.errors if isinstance(e, RowSkipped)}


def _human_gpt(question, answer):
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


# LLaVA-1.5's llava_v1_5_mix665k.json: one JSON array of {"id", "image", "conversations": [{"from": "human" | "gpt",
# "value"}]}, "<image>\n" before the first question (haotian-liu/LLaVA docs/Finetune_Custom_Data.md); short answers
# carry LLaVA-1.5's "Answer the question using a single word or phrase." / "Answer with the option's letter from the
# given choices directly."; ShareGPT rows have no image; grounding answers are [0, 1]-normalised boxes (the RefCOCO row
# below is the one quoted in haotian-liu/LLaVA#623).
def test_llava_mix665k_json_array(tmp_path):
    _image(tmp_path / "coco/train2017/000000314530.jpg")
    rows = [
        {
            "id": "000000033471",
            "image": "coco/train2017/000000033471.jpg",
            "conversations": [
                *_human_gpt(
                    "<image>\nWhat are the colors of the bus in the image?", "The bus in the image is white and red."
                ),
                *_human_gpt(
                    "What feature can be seen on the back of the bus?", "The back of the bus features an advertisement."
                ),
            ],
        },
        {
            "id": "000000215677",
            "image": "coco/train2017/000000215677.jpg",
            "conversations": _human_gpt(
                "<image>\nIs the man wearing a hat?\nAnswer the question using a single word or phrase.", "Yes"
            ),
        },
        {
            "id": "aokvqa_1",
            "image": "coco/train2017/000000215677.jpg",
            "conversations": _human_gpt(
                "<image>\nWhat is the man holding?\nA. a kite\nB. a frisbee\nC. an umbrella\nD. a bat\n"
                "Answer with the option's letter from the given choices directly.",
                "B",
            ),
        },
        {
            "id": "000000262145",
            "image": "coco/train2017/000000262145.jpg",
            "conversations": _human_gpt(
                "<image>\nHow many giraffes are there?\nAnswer the question using a single word or phrase.", "2"
            ),
        },
        {
            "id": "000000314530",
            "image": "coco/train2017/000000314530.jpg",
            "conversations": _human_gpt(
                "<image>\nPlease provide the bounding box coordinate of the region this sentence describes: a man bent "
                "over behind the cigarette.",
                "[0.61, 0.36, 0.92, 0.83]",
            ),
        },
        {"id": "i6IyJda_0", "model": "", "conversations": _human_gpt("Write a haiku about spring.", "…")},
        {
            "id": "000000033472",
            "image": "coco/train2017/000000033472.jpg",
            "conversations": _human_gpt("<image>\nDescribe the image concisely.", "A red bus parked by the road."),
        },
        {"id": "broken", "image": "coco/train2017/x.jpg", "conversations": [{"from": "gpt", "value": "hi"}]},
    ]
    path = tmp_path / "llava_v1_5_mix665k.json"
    path.write_text(json.dumps(rows, indent=2))  # pretty-printed, as LLaVA ships it

    result = load_samples(path, errors="skip", preset="llava")
    got = {s.id: s for s in result.samples}
    assert sorted(got) == ["000000033472", "000000215677", "000000262145", "000000314530", "aokvqa_1"]
    hat = got["000000215677"]
    assert (hat.answer_type, hat.answer, hat.question) == ("yesno", "yes", "Is the man wearing a hat?")
    assert hat.image == str(tmp_path / "coco/train2017/000000215677.jpg")
    mc = got["aokvqa_1"]
    assert (mc.answer_type, mc.answer) == ("choice", "B") and mc.question.endswith("D. a bat")
    assert (got["000000262145"].answer_type, got["000000262145"].answer) == ("number", "2")
    box = got["000000314530"]  # [0.61, 0.36, 0.92, 0.83] of a 200 x 100 image
    assert box.answer_type == "box" and box.boxes == [[122.0, 36.0, 184.0, 83.0]] and box.image_size == (200, 100)
    assert (got["000000033472"].answer_type, got["000000033472"].answer) == ("text", "A red bus parked by the road.")
    assert _skipped(result) == {1: "several_turns", 6: "no_image"}
    (bad,) = [e for e in result.errors if not isinstance(e, RowSkipped)]
    assert (bad.source, bad.row, bad.field) == (str(path), 8, "conversations")
    rep = result.conversion
    assert rep.rows == 8 and rep.not_inferred == [7]
    assert dict(rep.boxes) == {"normalised [0, 1] of the original image (scaled to pixels)": 1}
    assert rep.notes["answer-format instruction removed from the question"] == 3
    with pytest.raises(DataError, match=r"row 8, field 'conversations'"):  # errors="raise" still skips rows 1 and 6
        load_samples(path, preset="llava")


# VLM-R1's JSONL ("For your own data", om-ai-lab/VLM-R1 README): {"id", "image", "conversations"} with the image path
# relative to --image_folders, a list of paths for multi-image rows; REC answers are original-image pixels.
def test_vlm_r1_jsonl_through_the_llava_preset(tmp_path):
    rows = [
        {
            "id": 1,
            "image": "Clevr_CoGenT_TrainA_R1/data/images/CLEVR_trainA_000001_16885.png",
            "conversations": _human_gpt("<image>What number of purple metallic balls are there?", "0"),
        },
        {
            "id": 2,
            "image": [
                "Clevr_CoGenT_TrainA_R1/data/images/CLEVR_trainA_000001_16885.png",
                "Clevr_CoGenT_TrainA_R1/data/images/CLEVR_trainA_000001_16886.png",
            ],
            "conversations": _human_gpt(
                "<image><image>What number of purple metallic balls in total within the two images?", "3"
            ),
        },
        {
            "id": 3,
            "image": "train2014/COCO_train2014_000000581857.jpg",
            "accu_reward_method": "default",
            "conversations": _human_gpt(
                "<image>Please provide the bounding box coordinate of the region this sentence "
                "describes: the lady with the blue shirt.",
                "[103.93, 299.99, 238.15, 477.41]",
            ),
        },
    ]
    path = tmp_path / "annotations" / "rec.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _image(tmp_path / "images/train2014/COCO_train2014_000000581857.jpg", size=(427, 640))

    result = load_samples(path, errors="skip", preset="llava", image_root=tmp_path / "images")
    clevr, both, rec = result.samples
    assert (clevr.id, clevr.answer_type, clevr.answer) == ("1", "number", "0")  # the row's own id, kept
    assert clevr.image == str(tmp_path / "images/Clevr_CoGenT_TrainA_R1/data/images/CLEVR_trainA_000001_16885.png")
    assert clevr.images == [clevr.image]  # the one-image form
    # two images: kept, in order; their leading markers dropped (the images go first anyway); `image` stays None
    assert both.image is None and [Path(p).name for p in both.images] == [
        "CLEVR_trainA_000001_16885.png",
        "CLEVR_trainA_000001_16886.png",
    ]
    assert (both.question, both.answer) == ("What number of purple metallic balls in total within the two images?", "3")
    assert rec.answer_type == "box" and rec.boxes == [[103.93, 299.99, 238.15, 477.41]]  # pixels: kept as they are
    assert rec.image_size == (427, 640)  # not declared: read from the image header (box rewards convert with it)
    assert rec.meta == {"accu_reward_method": "default"}
    assert _skipped(result) == {} and dict(result.conversion.boxes) == {"original-image pixels": 1}


# R1-V: an HF dataset with `image` (Image), `problem`, `solution` = "<answer> {answer} </answer>" (Deep-Agent/R1-V
# process/process_parquet.py; leonardPKU/clevr_cogen_a_train). Visual-RFT: the same columns, the problem carrying its
# own answer-format instruction and the solution "<answer>[{'Position': [x1, y1, x2, y2], 'Confidence': 1}]</answer>"
# on a 0-1000 scale, or 'No Objects' (laolao77/ViRFT_COCO_base65 data card).
def test_r1v_and_visual_rft_parquet(tmp_path):
    datasets = pytest.importorskip("datasets")
    detect = (
        "Detect all objects belonging to the category '{c}' in the image, and provide the bounding boxes "
        "(between 0 and 1000, integer) and confidence (between 0 and 1, with two decimal places).\nIf no object "
        "belonging to the category '{c}' in the image, return 'No Objects'.\nOutput the thinking process in "
        "<think> </think> and final answer in <answer> </answer> tags."
    )
    table = {
        "image": [Image.open(io.BytesIO(_png())) for _ in range(4)],
        "problem": [
            "How many items are there in the image?",
            "What is the date on the letter?",
            detect.format(c="tv"),
            detect.format(c="zebra"),
        ],
        "solution": [
            "<answer> 3 </answer>",
            "<answer> 1/8/93 </answer>",
            "<answer>[{'Position': [1, 364, 98, 649], 'Confidence': 1}]</answer>",
            "<answer>No Objects</answer>",
        ],
    }
    ds = datasets.Dataset.from_dict(table).cast_column("image", datasets.Image())
    ds.to_parquet(str(tmp_path / "train.parquet"))

    result = load_samples(tmp_path / "train.parquet", errors="skip", preset="r1v")
    count, date, tv = result.samples
    assert (count.id, count.answer_type, count.answer) == ("train-1", "number", "3")  # no id: <file stem>-<row>
    assert isinstance(count.image, bytes) and count.image[:4] == b"\x89PNG"
    assert (date.answer_type, date.answer) == ("text", "1/8/93") and result.conversion.not_inferred == [2]
    assert tv.answer_type == "box" and tv.boxes == [[0.2, 36.4, 19.6, 64.9]] and tv.image_size == (200, 100)
    assert tv.question.endswith("return 'No Objects'.") and "<think>" not in tv.question
    assert _skipped(result) == {4: "no_gold_box"}
    assert dict(result.conversion.boxes) == {"0-1000 of the original image (Visual-RFT; scaled to pixels)": 1}


# VLM-R1's REC annotations (rec_jsons_processed/*.json): a JSON array; `solution` is [x1, y1, x2, y2] in original-image
# pixels, with `width`, `height` and a 0-1000 `normalized_solution` beside it (the row quoted in om-ai-lab/VLM-R1#11).
def test_vlm_r1_rec_json(tmp_path):
    row = {
        "height": 640,
        "width": 427,
        "id": 0,
        "original_id": 1719310,
        "dataset_name": "refcoco",
        "area": 14863.6156,
        "iscrowd": 0,
        "image_id": 0,
        "category_id": 1,
        "bbox_list": [[103.93, 299.99, 237.15, 476.41]],
        "text_type": "caption",
        "image": "train2014/COCO_train2014_000000581857.jpg",
        "problem": "Please provide the bounding box coordinate of the region this sentence describes: the lady "
        "with the blue shirt.",
        "normal_caption": "the lady with the blue shirt",
        "solution": [103.93, 299.99, 238.15, 477.41],
        "normalized_solution": [243, 468, 557, 745],
    }
    edge = {**row, "id": 1, "solution": [300.0, 500.0, 427.9, 640.5]}  # x + w + 1 past the right and bottom edges
    path = tmp_path / "refcoco_train.json"
    path.write_text(json.dumps([row, edge], indent=4))

    lady, clamped = load_samples(path, preset="r1v").samples
    assert lady.boxes == [[103.93, 299.99, 238.15, 477.41]] and lady.image_size == (427, 640)
    assert lady.meta["normal_caption"] == "the lady with the blue shirt" and "normalized_solution" not in lady.meta
    assert clamped.boxes == [[300.0, 500.0, 427.0, 640.0]]


# TRL's vision SFT data (HuggingFaceH4/llava-instruct-mix-vsft data card): `messages` = [{"role", "content": [{"index",
# "text", "type": "text" | "image"}]}] and `images` = a list of Image, saved with save_to_disk.
def test_messages_trl_saved_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")

    def part(kind, text=None, index=None):
        return {"index": index, "text": text, "type": kind}

    single = [
        {"role": "user", "content": [part("text", "How many dogs are in the picture?"), part("image", index=0)]},
        {"role": "assistant", "content": [part("text", "2")]},
    ]
    several = single + [
        {"role": "user", "content": [part("text", "What breed?")]},
        {"role": "assistant", "content": [part("text", "Corgis.")]},
    ]
    image = Image.open(io.BytesIO(_png()))
    ds = datasets.Dataset.from_dict({"messages": [single, several], "images": [[image], [image]]})
    ds = ds.cast_column("images", datasets.Sequence(datasets.Image()))
    ds.save_to_disk(str(tmp_path / "vsft"))

    result = load_samples(tmp_path / "vsft", errors="skip", preset="messages")
    (s,) = result.samples
    assert (s.id, s.question, s.answer_type, s.answer) == ("vsft-1", "How many dogs are in the picture?", "number", "2")
    assert isinstance(s.image, bytes) and _skipped(result) == {2: "several_turns"}


# OpenAI's vision fine-tuning JSONL (platform docs, "Vision fine-tuning: data format"): `messages` whose content is text
# or parts {"type": "image_url", "image_url": {"url": HTTP URL or base64 data URL}}, the image in its own user message.
# TRL's conversational prompt-completion rows (TRL docs, "Dataset formats": `images`, `prompt`, `completion`) too.
def test_messages_openai_jsonl_and_trl_prompt_completion(tmp_path):
    data_url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    _image(tmp_path / "sky.png", fmt="PNG")
    rows = [
        {
            "messages": [
                {"role": "system", "content": "You are an assistant that identifies animals."},
                {"role": "user", "content": "Is there a cat in this picture?"},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}}]},
                {"role": "assistant", "content": "Yes"},
            ]
        },
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Describe this artwork."},
                        {"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/a.jpg"}},
                    ],
                },
                {"role": "assistant", "content": "A sunflower still life."},
            ]
        },
        {
            "images": ["sky.png"],
            "prompt": [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What color is the sky?"}]}
            ],
            "completion": [{"role": "assistant", "content": [{"type": "text", "text": "It is blue."}]}],
        },
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    result = load_samples(path, errors="skip", preset="messages")
    cat, sky = result.samples
    assert (cat.question, cat.answer_type, cat.answer) == ("Is there a cat in this picture?", "yesno", "yes")
    assert cat.image == _png() and cat.meta == {"system": "You are an assistant that identifies animals."}
    assert (sky.image, sky.answer_type, sky.answer) == (str(tmp_path / "sky.png"), "text", "It is blue.")
    assert _skipped(result) == {2: "remote_image"}


# EasyR1 (hiyouga/EasyR1 examples/config.yaml: prompt_key problem, answer_key answer, image_key images; the prompt is
# split at "<image>" in verl/utils/dataset.py): a parquet with `images` (a list of Image), `problem`, `answer`, as
# hiyouga/geometry3k.
def test_easyr1_geometry3k_parquet_and_the_cli(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    image = Image.open(io.BytesIO(_png()))
    ds = datasets.Dataset.from_dict(
        {
            "images": [[image], [image], [image, image]],
            "problem": ["<image>Find x.", "<image>Find the length of the altitude.", "<image><image>Which is larger?"],
            "answer": ["3", "2 \\sqrt { 3 }", "A"],
        }
    ).cast_column("images", datasets.Sequence(datasets.Image()))
    src = tmp_path / "geometry3k" / "train.parquet"
    src.parent.mkdir()
    ds.to_parquet(str(src))

    out = tmp_path / "converted" / "train.jsonl"
    assert main(["data", "convert", str(src), "--preset", "easyr1", "--out", str(out)]) == 0
    report = capsys.readouterr().out
    assert "0 skipped" in report and "number 1, math 1, text 1" in report  # two images: kept
    x, altitude, larger = load_samples(out).samples  # the written file is plain vlgrpo JSONL
    assert (larger.question, larger.image) == ("Which is larger?", None)  # its leading markers: the images go first
    assert larger.images == [x.image, x.image]  # each embedded image written once, both entries pointing at it
    assert (x.question, x.answer_type, x.answer) == ("Find x.", "number", "3")
    assert (altitude.answer_type, altitude.answer) == ("math", "2 \\sqrt { 3 }")
    assert x.image == altitude.image and x.image.startswith(str(tmp_path / "converted" / "train_images"))
    assert Image.open(x.image).size == (200, 100)  # the embedded image was written once, as a file


def test_columns_without_a_preset(tmp_path, capsys):
    _image(tmp_path / "a.png", fmt="PNG")
    path = tmp_path / "custom.jsonl"
    row = {"img": "a.png", "query": "Is it red?", "label": "<answer> Yes </answer>", "k": 1}
    path.write_text(json.dumps(row) + "\n")
    (s,) = load_samples(path, columns={"image": "img", "question": "query", "answer": "label"}).samples
    assert (s.id, s.image, s.answer) == ("custom-1", str(tmp_path / "a.png"), "yes")
    assert (s.answer_type, s.meta) == ("yesno", {"k": 1})
    with pytest.raises(DataError, match=r"data.columns maps onto \['prompt'\], which are not row fields"):
        load_samples(path, columns={"prompt": "query"})
    with pytest.raises(DataError, match=r"custom.jsonl, row 1, field 'question_text': is mapped by data.columns"):
        load_samples(path, columns={"question": "question_text"})
    out = tmp_path / "out.jsonl"
    columns = "image=img,question=query,answer=label"
    assert main(["data", "convert", str(path), "--columns", columns, "--out", str(out)]) == 0
    assert load_samples(out).samples[0].answer == "yes"
    assert parse_columns("question=problem, answer=solution") == {"question": "problem", "answer": "solution"}
    with pytest.raises(InputError, match="target=source"):
        parse_columns("question")


def test_config_keys_read_the_preset_registry():
    assert CHOICES["data.preset"] == ("none", *PRESETS)  # both read vlgrpo.registry.DATA_PRESET
    cfg = load_config(None, ["data.preset=r1v", "data.columns={problem: query}"])
    assert (cfg.data.preset, cfg.data.columns) == ("r1v", {"problem": "query"})
    with pytest.raises(ConfigError, match="data.preset.*none, llava, messages, r1v, easyr1"):
        load_config(None, ["data.preset=llama"])


@pytest.mark.parametrize(
    "keys, expected",
    [
        (["id", "image", "conversations"], ["llava"]),  # LLaVA-1.5, VLM-R1's JSONL
        (["messages", "images"], ["messages"]),  # TRL
        (["images", "prompt", "completion"], ["messages"]),  # TRL prompt-completion
        (["image", "problem", "solution", "width", "height", "normal_caption"], ["r1v"]),  # R1-V, VLM-R1 REC
        (["images", "problem", "answer"], ["easyr1"]),
        (["image", "problem", "answer"], []),  # neither R1-V (solution) nor EasyR1 (images): no guess
        (list(FIELDS), []),  # a vlgrpo row
    ],
)
def test_matching_presets_reads_each_converters_declared_shape(keys, expected):
    assert matching_presets(keys) == expected


@pytest.mark.parametrize(
    "answer, question, hint, expected",
    [
        ("Yes.", "", None, ("yesno", "yes")),
        ("(C)", "Which one?\n(A) red (B) blue (C) green", None, ("choice", "C")),
        ("B. a frisbee", "A. a kite\nB. a frisbee", None, ("choice", "B")),
        ("A", "What letter starts the word?", None, None),  # no options listed: an answer, not a choice
        ("A", "Which?", "mcq", ("choice", "A")),  # VLM-R1's accu_reward_method says it is one
        ("1,000", "", None, ("number", "1000")),
        ("-2.5", "", None, ("number", "-2.5")),
        ("\\frac{3}{4}", "", None, ("math", "\\frac{3}{4}")),
        ("3/4", "", None, ("math", "3/4")),
        ("white and red", "", None, None),
    ],
)
def test_infer_answer(answer, question, hint, expected):
    assert infer_answer(answer, question, hint) == expected


# R1-V's clevr_cogen_a_train rows (Deep-Agent/R1-V README: image, problem, solution "<answer> 3 </answer>"), one with
# two images: `vlgrpo data doctor --preset` reads them as training does.
def test_doctor_reads_a_preset_and_column_renames(tmp_path, capsys):
    _image(tmp_path / "a.png", fmt="PNG")
    rows = [
        {"image": "a.png", "problem": "How many cubes are there?", "solution": "<answer> 3 </answer>"},
        {"image": ["a.png", "a.png"], "problem": "Same?", "solution": "<answer> yes </answer>"},
    ]
    path = tmp_path / "r1v.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["data", "doctor", str(path), "--no-progress", "--json"]
    assert main(argv) == 1  # without the preset: no `question` field
    assert '"check": "row_problem"' in capsys.readouterr().out  # an unknown field: the schema names it
    assert main([*argv, "--preset", "r1v"]) == 0  # the two-image row trains like any other
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == 0 and report["splits"]["r1v.jsonl"]["samples"] == 2
    assert report["findings"] == []
    renamed = tmp_path / "custom.jsonl"
    renamed.write_text(json.dumps({"img": "a.png", "query": "Is it red?", "label": "yes"}) + "\n")
    columns = "image=img,question=query,answer=label"
    assert main(["data", "doctor", str(renamed), "--no-progress", "--columns", columns]) == 0


# DeepEyes-47k (ChenShawn/DeepEyes-Datasets-47k), verl's RL parquet rows as Visual-Agent/DeepEyes trains on them:
# `prompt` chat messages (the system turn describes image_zoom_in_tool; the user turn holds `<image>`, split there by
# verl/utils/dataset/rl_dataset.py, and PROMPT.USER_PROMPT_V2), `images` a list of {"bytes", "path"}, `reward_model`
# {"ground_truth", "style"}, `extra_info` {"question", "answer", "index", "split"} (vl_agent.py's reward reads
# extra_info["question"]), `data_source` (vstar, chart, thinklite_eureka: verl/utils/reward_score/__init__.py),
# `env_name` (visual_toolbox_v2 for the rows whose rollout may call the tool), `ability`.
DEEPEYES_SYSTEM = "You are a helpful assistant.\n\n# Tools\nYou may call one or more functions to assist with the user"
DEEPEYES_INSTRUCTION = (
    "\nThink first, call **image_zoom_in_tool** if needed, then answer. Format strictly as:  <think>...</think>  "
    "<tool_call>...</tool_call> (if tools needed)  <answer>...</answer> "
)


def _deepeyes_row(source, question, truth, env="visual_toolbox_v2", asked=True, images=1, turns=()):
    return {
        "data_source": source,
        "prompt": [
            {"role": "system", "content": DEEPEYES_SYSTEM},
            {"role": "user", "content": "<image>\n" + question + DEEPEYES_INSTRUCTION},
            *turns,
        ],
        "images": [{"bytes": _png(), "path": None} for _ in range(images)],
        "ability": "vqa" if source != "thinklite_eureka" else "math",
        "env_name": env,
        "reward_model": {"ground_truth": truth, "style": "model"},
        "extra_info": {"question": question if asked else None, "answer": truth, "index": 7, "split": "train"},
    }


def test_deepeyes_parquet_rows(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        _deepeyes_row("vstar", "What is the color of the woman's bag?", "The woman's bag is red."),
        _deepeyes_row("chart", "What is the highest value in the chart?", "42"),
        _deepeyes_row("thinklite_eureka", "Find x.", "\\frac{1}{2}", env="", asked=False),
        _deepeyes_row("vstar", "Which side is the dog on?\n(A) left\n(B) right", "B"),
        _deepeyes_row("vstar", "Is it red?", "yes", turns=[{"role": "assistant", "content": "<answer>yes</answer>"}]),
        _deepeyes_row("vstar", "Is it red?", "yes", images=0),
    ]
    src = tmp_path / "data_v0.8_visual_toolbox_v2.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)

    result = load_samples(src, preset="deepeyes")
    bag, chart, math, side = result.samples
    assert (bag.question, bag.answer_type, bag.answer) == (
        "What is the color of the woman's bag?",
        "text",  # a sentence: the judge reward (reward.judge) scores it, as DeepEyes' Qwen2.5-72B judge does
        "The woman's bag is red.",
    )
    assert isinstance(bag.image, bytes) and bag.image == _png()
    assert bag.meta == {
        "data_source": "vstar",
        "ability": "vqa",
        "env_name": "visual_toolbox_v2",
        "extra_info": {
            "question": "What is the color of the woman's bag?",
            "answer": "The woman's bag is red.",
            "index": 7,
            "split": "train",
        },
        "system": DEEPEYES_SYSTEM,
    }
    assert (chart.answer_type, chart.answer) == ("number", "42")
    # no extra_info.question: the user turn without <image> and without DeepEyes' format instruction
    assert (math.question, math.answer_type, math.answer) == ("Find x.", "math", "\\frac{1}{2}")
    assert (side.answer_type, side.answer) == ("choice", "B")  # a letter the question lists
    assert _skipped(result) == {5: "several_turns", 6: "no_image"} and len(result.errors) == 2

    out = tmp_path / "converted.jsonl"
    assert main(["data", "convert", str(src), "--preset", "deepeyes", "--out", str(out)]) == 0
    assert "2 skipped" in capsys.readouterr().out
    assert [s.answer for s in load_samples(out).samples] == ["The woman's bag is red.", "42", "\\frac{1}{2}", "B"]

    bad = tmp_path / "bad.parquet"  # a row without its gold answer is an error naming the field, not a skip
    no_gold = {**_deepeyes_row("chart", "What is it?", "x"), "reward_model": {"ground_truth": "", "style": "model"}}
    pq.write_table(pa.Table.from_pylist([rows[0], no_gold]), bad)
    with pytest.raises(DataError, match=r"bad.parquet, row 2, field 'reward_model': needs ground_truth"):
        load_samples(bad, preset="deepeyes")


def test_deepeyes_rows_are_told_apart_from_the_other_presets():
    keys = ["data_source", "prompt", "images", "ability", "env_name", "reward_model", "extra_info"]
    assert matching_presets(keys) == ["deepeyes"]
    assert matching_presets(["prompt", "images", "reward_model"]) == []  # verl's rows without data_source: no guess
    assert CHOICES["data.preset"][-1] == "deepeyes"
