"""Rows with several images or a video: the schema (`images`, `video`, markers, boxes naming their image), the prompt
order, the row check that skips them in training for now, the length budget by hand, and the presets that keep them
through `vlgrpo data convert`."""

import json
from pathlib import Path

import pytest
from PIL import Image
from video_files import write_mp4

from vlgrpo.cli import main
from vlgrpo.data.adapters import load_samples
from vlgrpo.data.doctor import check_split, text_estimate
from vlgrpo.data.doctor_report import DoctorSettings
from vlgrpo.data.images import DEFAULT_GEOMETRY, inspect_image
from vlgrpo.data.prompts import instruction, render_messages
from vlgrpo.data.rowcheck import RowVisuals, prompt_budget, row_problems
from vlgrpo.data.schema import DataError, sample_from_dict
from vlgrpo.data.video import VideoSampling, inspect_video
from vlgrpo.types import Sample, Video


@pytest.fixture
def folder(tmp_path) -> Path:
    Image.new("RGB", (112, 112), (200, 0, 0)).save(tmp_path / "a.png")
    Image.new("RGB", (448, 224), (0, 200, 0)).save(tmp_path / "b.png")
    for k in range(5):
        Image.new("RGB", (64, 48), (40 * k, 0, 0)).save(tmp_path / f"f{k}.png")
    write_mp4(tmp_path / "v.mp4", 30)  # 3 s at 10 fps
    return tmp_path


def _row(**fields) -> dict:
    return {"id": "r", "question": "Which is wider?", "answer": "second", **fields}


def test_one_image_rows_keep_their_form():
    s = Sample("a", "q", image="a.png")
    assert (s.image, s.images, s.several_images_or_video) == ("a.png", ["a.png"], False)
    assert Sample("b", "q", images=["a.png"]).image == "a.png"  # one image given as a list: the one-image form
    assert "images" not in s.to_dict() and "video" not in s.to_dict()  # written as it always was
    two = Sample("c", "q", images=["a.png", "b.png"])
    assert two.image is None and two.several_images_or_video  # never "the first of several"
    clip = Sample("d", "q", image="a.png", video=Video(path="v.mp4"))
    assert clip.image is None and clip.images == ["a.png"]
    with pytest.raises(ValueError, match="one-image form"):
        Sample("e", "q", image="a.png", images=["a.png", "b.png"])


def test_schema_reads_images_video_markers_and_boxes(folder):
    src = str(folder / "d.jsonl")
    s = sample_from_dict(_row(images=["a.png", "b.png"]), src, 1, folder)
    assert s.images == [str(folder / "a.png"), str(folder / "b.png")] and s.image is None
    v = sample_from_dict(_row(video={"frames": ["f0.png", "f1.png"], "fps": 1, "max_frames": 4}), src, 2, folder)
    assert v.video == Video(frames=[str(folder / "f0.png"), str(folder / "f1.png")], fps=1.0, max_frames=4)
    assert sample_from_dict(_row(video="v.mp4"), src, 3, folder).video == Video(path=str(folder / "v.mp4"))
    boxes = [{"image": 1, "box": [10, 20, 30, 40]}, {"image": 0, "box": [1, 2, 3, 4]}]
    b = sample_from_dict(_row(images=["a.png", "b.png"], answer_type="box", boxes=boxes), src, 4, folder)
    assert (b.boxes, b.box_images) == ([[10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0]], [1, 0])
    assert sample_from_dict(b.to_dict(), src, 4, None).box_images == [1, 0]  # to_dict writes the named form back
    refused = [
        (
            _row(images=["a.png", "b.png"], answer_type="box", boxes=[[1, 2, 3, 4]]),
            "row 5, field 'boxes': the row has 2 images: name the image of each box",
        ),
        (_row(images=["a.png", "b.png"], boxes=[{"image": 2, "box": [1, 2, 3, 4]}]), r"field 'boxes'.* 0\.\.1"),
        (_row(image="a.png", images=["b.png"]), "field 'images': give `image`"),
        (_row(image=["a.png", "b.png"]), "field 'image': holds one image; put several in `images`"),
        ({**_row(images=["a.png", "b.png"]), "question": "Is <image> wider?"}, r"field 'question': has 1 <image>"),
        ({**_row(image="a.png"), "question": "<video> or <image>?"}, "0 video"),
        (_row(video={"path": "v.mp4", "frames": ["f0.png"]}), "field 'video': a video mapping has `path`"),
        (_row(video={"path": "v.mp4", "fps": 0}), "fps must be a number > 0"),
        (_row(images=["a.png", "b.png"], image_size=[112, 112]), "field 'image_size'"),
        (_row(video="v.mp4", answer_type="box", boxes=[[1, 2, 3, 4]]), "only a video"),
        (_row(), "field 'image': is required and missing or empty"),
    ]
    for row, message in refused:
        with pytest.raises(DataError, match=message):
            sample_from_dict(row, src, 5, folder)


def test_markers_place_the_parts_else_they_go_first():
    text = lambda parts: [p.get("text", p["type"]) for p in parts]  # noqa: E731
    tail = " " + instruction("text", "answer", "qwen2_5")
    first = Sample("a", "Which is wider?", images=["a.png", "b.png"], video=Video(path="v.mp4"))
    assert text(render_messages(first, "answer")[0]["content"]) == ["image", "image", "video", "Which is wider?" + tail]
    placed = Sample(
        "b", "Is <image> wider than <image> in <video>?", images=["a.png", "b.png"], video=Video(path="v.mp4")
    )
    assert text(render_messages(placed, "answer")[0]["content"]) == [
        "Is ",
        "image",
        " wider than ",
        "image",
        " in ",
        "video",
        "?" + tail,
    ]
    one = Sample("c", "What is <image> this?", image="a.png")  # a marker places the one image too
    assert text(render_messages(one, "answer")[0]["content"]) == ["What is ", "image", " this?" + tail]


def test_rows_with_several_images_or_a_video_have_no_problem_of_their_own(folder):
    """Such rows train: only a real problem (a missing part, a box outside its image) keeps one out."""
    two = Sample("two", "q", "x", images=[str(folder / "a.png"), str(folder / "b.png")])
    clip = Sample("clip", "q", "x", video=Video(path=str(folder / "v.mp4")))
    assert row_problems(two, RowVisuals([inspect_image(p) for p in two.images]), DEFAULT_GEOMETRY) == []
    assert row_problems(clip, RowVisuals([], inspect_video(clip.video, VideoSampling())), DEFAULT_GEOMETRY) == []
    boxes = Sample(
        "boxes", "Where?", None, "box", images=two.images, boxes=[[1, 1, 5, 5], [2, 2, 6, 6]], box_images=[0, 1]
    )
    problems = row_problems(boxes, RowVisuals([inspect_image(p) for p in two.images]), DEFAULT_GEOMETRY)
    assert [p[0] for p in problems] == ["boxes_across_images"]  # a box answer names no image
    one = Sample("one", "q", "x", image=str(folder / "a.png"))
    assert row_problems(one, inspect_image(one.image), DEFAULT_GEOMETRY) == []


def test_prompt_budget_by_hand(folder):
    two = Sample("two", "Which is wider?", "second", images=[str(folder / "a.png"), str(folder / "b.png")])
    visuals = RowVisuals([inspect_image(p) for p in two.images])
    budget = prompt_budget(two, visuals, DEFAULT_GEOMETRY, 10)
    # 112x112 -> 8x8 patches = 16 tokens; 448x224 -> 32x16 patches = 128; template 13 + 2 x 2 + 6 default system
    assert (budget.images, budget.video, budget.template, budget.total) == ((16, 128), 0, 23, 177)
    clip = Sample("clip", "What happens?", "x", video=Video(path=str(folder / "v.mp4")))
    visuals = RowVisuals([], inspect_video(clip.video, VideoSampling()))
    # 3 s at 2 fps = 6 frames -> 3 temporal patches x 140 tokens per 280x392 px frame (see test_video)
    assert prompt_budget(clip, visuals, DEFAULT_GEOMETRY, 0, "Be brief.").certain == 420 + 13 + 2
    frames = Sample("frames", "q", "x", video=Video(frames=[str(folder / f"f{k}.png") for k in range(5)]))
    visuals = RowVisuals([], inspect_video(frames.video, VideoSampling(max_pixels=28 * 28 * 4)))
    assert prompt_budget(frames, visuals, DEFAULT_GEOMETRY, 0).video == 3 * 4  # 5 frames padded to 6, 4 tokens each


def test_doctor_lists_rows_over_the_budget_and_warns_of_the_rest(folder):
    rows = [
        _row(id="two", images=["a.png", "b.png"]),
        _row(id="clip", video="v.mp4", question="What happens?"),
        _row(id="short", video={"frames": ["f0.png", "f1.png"], "max_frames": 2}, question="What happens?"),
        _row(
            id="box",
            images=["a.png", "b.png"],
            answer_type="box",
            answer=None,
            boxes=[{"image": 0, "box": [100, 10, 120, 20]}, {"image": 1, "box": [100, 10, 120, 20]}],
        ),
        _row(id="gone", images=["a.png", "nope.png"]),
    ]
    (folder / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats, findings = check_split("d", str(folder / "d.jsonl"), DoctorSettings(max_prompt_length=300))
    by_row: dict[int, list[tuple[str, str]]] = {}
    for f in findings:
        by_row.setdefault(f.row, []).append((f.severity, f.check))
    assert by_row == {  # row 1 (144 image tokens + 23 + text) and row 3 (2 frames x 140 / 2 = 140 tokens) fit
        2: [("error", "prompt_too_long")],  # 420 video tokens
        4: [("error", "boxes_across_images"), ("error", "box_out_of_image")],  # only image 0 (112 px) is too small
        5: [("error", "image_missing")],
    }
    message = {f.row: f.message for f in findings if f.severity == "error"}
    assert message[2].startswith("its video (6 frames of 64x48 px: 420 tokens): 420 visual tokens, 441 with the chat")
    assert message[4].startswith("image 0 of 2: box [100.0, 10.0, 120.0, 20.0]")
    assert message[5].startswith("image 1 of 2: image file") and "nope.png" in message[5]
    assert sorted(stats.image_tokens) == [140, 144, 144, 420]  # the rows whose parts all decode
    text = f"What happens? {instruction('text', 'think_answer', 'qwen2_5')}"
    assert stats.prompt_tokens_max == 420 + 13 + 2 + 6 + text_estimate(text, "")
    assert (stats.images, stats.videos) == (3, 2)


def test_presets_keep_several_images_and_videos_through_convert(folder, capsys):
    hg = lambda q, a: [{"from": "human", "value": q}, {"from": "gpt", "value": a}]  # noqa: E731
    (folder / "raw").mkdir()
    llava = [
        {"id": 1, "image": ["../a.png", "../b.png"], "conversations": hg("<image>\n<image>\nWider one?", "B")},
        {"id": 2, "video": "../v.mp4", "conversations": hg("<video>\nWhat happens?", "it brightens")},
        {"id": 3, "image": ["../a.png", "../b.png"], "conversations": hg("Where?", "[1, 2, 30, 40]")},
        {"id": 4, "image": "../a.png", "conversations": hg("<image>Q?", "yes"), "more": 1},
        {"id": 5, "image": "../a.png", "conversations": [*hg("Q?", "yes"), *hg("And?", "no")]},
    ]
    (folder / "raw/llava.json").write_text(json.dumps(llava))
    out = folder / "conv/llava.jsonl"
    assert main(["data", "convert", str(folder / "raw/llava.json"), "--preset", "llava", "--out", str(out)]) == 1
    report = capsys.readouterr().out
    assert "3 samples written, 1 skipped, 1 invalid" in report and "several_turns: rows 5" in report
    assert "row 3, field 'conversations': a box answer on a row with 2 images" in report
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["images"] == ["../a.png", "../b.png"] and rows[1]["video"] == "../v.mp4"  # relative to OUT
    two, clip, one = load_samples(out).samples
    assert (two.images, two.question) == ([str(folder / "conv/../a.png"), str(folder / "conv/../b.png")], "Wider one?")
    assert clip.video == Video(path=str(folder / "conv/../v.mp4")) and clip.question == "What happens?"
    assert one.image == str(folder / "conv/../a.png")

    messages = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Compare"},
                        {"type": "image"},
                        {"type": "text", "text": "and"},
                        {"type": "image"},
                        {"type": "video", "video": ["f0.png", "f1.png", "f2.png"]},
                        {"type": "text", "text": "Same colour?"},
                    ],
                },
                {"role": "assistant", "content": "no"},
            ],
            "images": ["a.png", "b.png"],
        }
    ]
    (folder / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in messages))
    out = folder / "conv/m.jsonl"
    assert main(["data", "convert", str(folder / "m.jsonl"), "--preset", "messages", "--out", str(out)]) == 0
    assert "1 samples written, 0 skipped" in capsys.readouterr().out
    (s,) = load_samples(out).samples
    assert s.question == "Compare<image>and<image><video>Same colour?" and s.answer_type == "yesno"  # parts in place
    assert [Path(p).name for p in s.images] == ["a.png", "b.png"]
    assert [Path(p).name for p in s.video.frames] == ["f0.png", "f1.png", "f2.png"]
    assert json.loads(out.read_text())["video"] == ["../f0.png", "../f1.png", "../f2.png"]

    easyr1 = [
        {"images": [], "videos": [["f0.png", "f1.png", "gone.png"]], "problem": "<video>Brighter?", "answer": "yes"},
        {"images": ["a.png"], "videos": ["v.mp4"], "problem": "<image><video>Same?", "answer": "no"},
        {"videos": ["v.mp4", "v.mp4"], "problem": "<video><video>Same?", "answer": "yes"},
    ]
    (folder / "e.jsonl").write_text("".join(json.dumps(r) + "\n" for r in easyr1))
    out = folder / "conv/e.jsonl"
    assert main(["data", "convert", str(folder / "e.jsonl"), "--preset", "easyr1", "--out", str(out), "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["skipped"] == {"several_videos": [3]} and summary["samples"] == 1
    assert summary["missing_images"] == [
        {
            "row": 1,
            "image": str(folder / "gone.png"),
            "problem": f"frame 2 of the video '{folder / 'gone.png'}' does not exist",
        }
    ]
    (s,) = load_samples(out).samples
    assert (s.images, s.video, s.question) == (
        [str(folder / "conv/../a.png")],
        Video(str(folder / "conv/../v.mp4")),
        "Same?",
    )


def test_the_doctor_of_a_run_config_samples_video_as_its_data_video_says(folder):
    """`vlgrpo data doctor` reads data.video from the config: 3 s at 10 fps sampled at 2 fps is 6 frames (420
    tokens); with data.video.max_frames=4 it is 4 frames, 2 temporal patches of 140 tokens (280)."""
    from vlgrpo.preflight import diagnose

    (folder / "d.jsonl").write_text(json.dumps(_row(id="clip", video="v.mp4", question="What happens?")) + "\n")
    tokens = {}
    for frames in (32, 4):
        report = diagnose(str(folder / "d.jsonl"), [f"data.video.max_frames={frames}", "data.max_prompt_length=2000"])
        tokens[frames] = report.splits["d.jsonl"].image_tokens
    assert tokens == {32: [420], 4: [280]}


def test_the_budget_counts_qwen3_vl_timestamps(folder):
    """Qwen3-VL writes `<t seconds>` and a wrap before each temporal patch: 3 patches x 8 tokens replace the one wrap.
    Exact for this tokenizer-free count: the trainer counts the tokenised prompt itself."""
    clip = Sample("clip", "What happens?", "x", video=Video(path=str(folder / "v.mp4")))
    visuals = RowVisuals([], inspect_video(clip.video, VideoSampling()))
    plain = prompt_budget(clip, visuals, DEFAULT_GEOMETRY, 0, "Be brief.")
    stamped = prompt_budget(clip, visuals, DEFAULT_GEOMETRY, 0, "Be brief.", timestamps=True)
    assert stamped.template - plain.template == 3 * 8 - 2 and stamped.video == plain.video == 420
