"""Rows with several images or a video through the trainer: prompts, cached features (one encoder call for the images
and one for the videos of a batch), and the log-prob passes against the model's own pixel forward, for Qwen2-VL,
Qwen2.5-VL (seconds per temporal patch) and Qwen3-VL (timestamps in the text, DeepStack maps)."""

import pytest
import torch
from trainer_helpers import tiny_config

from vlgrpo.data.adapters import load_samples
from vlgrpo.data.images import load_image
from vlgrpo.data.synth import synth_dataset
from vlgrpo.grpo.logprobs import token_logprobs
from vlgrpo.policy.forward import completion_logprobs_and_entropy
from vlgrpo.tiny import init_tiny
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state
from vlgrpo.types import Completion, RolloutGroup

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    """A 30-row file mixing one-image (count), two-image (compare) and video (motion) rows, at 64 px."""
    out = tmp_path_factory.mktemp("mixed")
    synth_dataset(out, 30, seed=3, image_size=64, kinds=("count", "compare", "motion"))
    return out


def pixel_inputs(processor, prompt, geometry, seconds_scale: float = 1.0) -> dict:
    """The model's own inputs for one prompt: our ids, pixels from the processors (frames at the model's size)."""
    ids = torch.tensor([prompt.input_ids])
    out = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "mm_token_type_ids": torch.tensor([prompt.mm_token_type_ids]),
    }
    images = [s for s in prompt.sources if isinstance(s, (str, bytes))]
    if images:
        pix = processor.image_processor(images=[load_image(s) for s in images], return_tensors="pt")
        out.update(pixel_values=pix["pixel_values"], image_grid_thw=pix["image_grid_thw"])
    if prompt.video_grid_thw is not None:
        clip = prompt.sources[-1]
        pix = processor.video_processor(
            videos=[clip.resized_frames(geometry)], do_resize=False, do_sample_frames=False, return_tensors="pt"
        )
        out.update(pixel_values_videos=pix["pixel_values_videos"], video_grid_thw=pix["video_grid_thw"])
        if type(processor).__name__.startswith("Qwen2_5"):
            out["second_per_grid_ts"] = torch.tensor([2 / clip.info().sample_fps * seconds_scale])
    return out


def own_logprobs(model, inputs: dict, completion: list[int], forbidden) -> torch.Tensor:
    comp = torch.tensor([completion])
    x = dict(inputs)
    x["input_ids"] = torch.cat([x["input_ids"], comp], 1)
    x["attention_mask"] = torch.cat([x["attention_mask"], torch.ones_like(comp)], 1)
    x["mm_token_type_ids"] = torch.cat([x["mm_token_type_ids"], torch.zeros_like(comp)], 1)
    with torch.no_grad():
        logits = model(**x).logits[:, -comp.shape[1] - 1 : -1]
    return token_logprobs(logits, comp, forbidden=forbidden)[0][0]


@pytest.mark.parametrize("arch", ARCHS)
def test_trainer_logprobs_over_mixed_rows_equal_the_models_own_forward(tmp_path, mixed_dir, spread, arch):
    model_dir = init_tiny(tmp_path / "m", arch)
    cfg = tiny_config(
        str(model_dir),
        mixed_dir,
        tmp_path / "run",
        "model.gradient_checkpointing=true",
        "data.video.max_pixels=50176",
        "data.video.fps=4.0",
    )
    state = build_state(cfg, progress=False)
    try:
        trainer, model, processor = Trainer(state), state.backend.model, state.lm.processor
        spread(model, 0.1)
        samples = load_samples(mixed_dir / "train.jsonl").samples[:3]
        assert [len(s.images) for s in samples] == [1, 2, 0] and samples[2].video is not None
        tok = processor.tokenizer
        texts = [["<answer>3</answer>", "two"], ["<answer>first</answer>", "second"], ["<answer>left", "right"]]
        prompts = [state.rows.prompt(s) for s in samples]
        groups = [
            RolloutGroup(s, p.input_ids, [Completion(tok(t)["input_ids"] + [tok.eos_token_id], t, "stop") for t in ts])
            for s, p, ts in zip(samples, prompts, texts)
        ]
        feats = state.cache.get_rows([p.sources for p in prompts])
        stats = state.cache.stats()
        assert (stats["encoder_calls"], stats["images_encoded"], stats["videos_encoded"]) == (2, 3, 1)
        batch = trainer._collate(groups, feats)
        own = [
            own_logprobs(model, pixel_inputs(processor, p, state.geometry), c.token_ids, state.forbidden)
            for p, g in zip(prompts, groups)
            for c in g.completions
        ]
        old = trainer._logprobs(model, batch)  # eval mode: one prefill per prompt, the packed completion pass
        model.train()  # the update pass: gradient checkpointing -> whole rows through policy_logits
        for rows, part, fs in trainer.micro_batches(batch):
            new, _ = completion_logprobs_and_entropy(model, part, fs, state.forbidden)
            for r, lp in zip(range(rows.start, rows.stop), new):
                assert (lp[: len(own[r])] - own[r]).abs().max() <= 1e-5
        for r, ref in enumerate(own):
            assert (old[r, : len(ref)] - ref).abs().max() <= 1e-5
        if arch == "qwen2_5_vl":  # the video's seconds per temporal patch place its positions: a wrong one shows
            wrong = own_logprobs(
                model,
                pixel_inputs(processor, prompts[2], state.geometry, 2.0),
                groups[2].completions[0].token_ids,
                state.forbidden,
            )
            assert (wrong - own[4]).abs().max() > 1e-4
    finally:
        state.close()


def test_the_encoder_runs_once_per_unique_image_and_video_per_step(tmp_path, mixed_dir, tiny_model_dir):
    """Repeated images across and inside rows, a repeated video: two encoder calls (images, videos), each unique
    part encoded once; a hit, in memory or on disk, equals a fresh encode bit for bit."""
    from vlgrpo.data.video import VideoSampling, visual_sources
    from vlgrpo.models import load_model
    from vlgrpo.vision_cache import VisionCache

    lm = load_model(str(tiny_model_dir("qwen3_vl")))
    rows = load_samples(mixed_dir / "train.jsonl").samples
    compare = next(s for s in rows if len(s.images) == 2)
    motion = next(s for s in rows if s.video is not None)
    a, b = compare.images
    sampling = VideoSampling(max_pixels=50176)
    clip = visual_sources(motion, sampling)[0]
    batch = [[a, b], [a], [b, a, a], [clip], [visual_sources(motion, sampling)[0]]]
    cache = VisionCache(lm.model, lm.processor, disk_dir=tmp_path / "cache")
    with torch.no_grad():
        got = cache.get_rows(batch)
    s = cache.stats()
    assert (s["encoder_calls"], s["images_encoded"], s["videos_encoded"], s["misses"]) == (2, 2, 1, 3)
    assert got[1][0] is got[0][0] and got[2][2] is got[0][0] and got[4][0] is got[3][0]
    video = got[3][0]
    assert video.is_video and video.deepstack is not None and video.grid_thw.tolist()[0] == 2  # 4 frames: 2 patches
    fresh = VisionCache(lm.model, lm.processor)  # memory, no disk: encodes again
    again = VisionCache(lm.model, lm.processor, disk_dir=tmp_path / "cache")  # a restart: read from disk
    with torch.no_grad():
        for other in (fresh, again):
            (x,) = other.get([clip])
            assert torch.equal(x.embeds, video.embeds) and torch.equal(x.deepstack, video.deepstack)
            assert x.video_fps == video.video_fps and torch.equal(x.grid_thw, video.grid_thw)
    assert again.stats()["disk_hits"] == 1 and again.stats()["encoder_calls"] == 0
    # the video's key follows its sampling: other pixel bounds are another entry, never a stale hit
    with torch.no_grad():
        (small,) = cache.get([visual_sources(motion, VideoSampling(max_pixels=28 * 28 * 16))[0]])
    assert small.embeds.shape[0] < video.embeds.shape[0] and cache.stats()["videos_encoded"] == 2


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_ids_of_two_images_and_a_video_are_the_processors(mixed_dir, tiny_model_dir, arch):
    """Qwen2/2.5-VL: the ids `processor(text, images, videos)` gives. Qwen3-VL: its own processor's layout, one
    `<t seconds>` block per temporal patch in place of the whole <|vision_start|><|video_pad|><|vision_end|>
    (transformers 5.20's generic path nests the blocks inside the template's pair; Qwen's processor does not)."""
    from vlgrpo.data.images import ProcessorGeometry
    from vlgrpo.data.prompts import render_messages
    from vlgrpo.data.video import VideoSampling
    from vlgrpo.models import load_model
    from vlgrpo.policy.prompt import build_prompt
    from vlgrpo.types import Sample

    lm = load_model(str(tiny_model_dir(arch)))
    p, rows = lm.processor, load_samples(mixed_dir / "train.jsonl").samples
    compare, motion = rows[1], rows[2]
    s = Sample(
        "x", "Is <image> like <image>, and what moves in <video>?", "no", images=compare.images, video=motion.video
    )
    sampling = VideoSampling(fps=2.0, max_pixels=50176)
    prompt = build_prompt(s, p, None, "answer", "qwen2_5", "", sampling)
    text = p.apply_chat_template(render_messages(s, "answer"), add_generation_prompt=True, tokenize=False)
    frames = prompt.sources[-1].resized_frames(ProcessorGeometry.from_processor(p))
    t, gh, gw = prompt.video_grid_thw[0].tolist()
    assert (t, len(frames)) == (2, 4)  # 4 frames taken at 2 fps: 2 temporal patches
    if arch != "qwen3_vl":
        ref = p(
            text=[text],
            images=[load_image(i) for i in s.images],
            videos=[frames],
            return_tensors="pt",
            videos_kwargs={"do_resize": False, "do_sample_frames": False},
        )
        assert prompt.input_ids == ref["input_ids"][0].tolist()
        assert prompt.mm_token_type_ids == ref["mm_token_type_ids"][0].tolist()
        assert prompt.image_grid_thw.tolist() == ref["image_grid_thw"].tolist()
        assert prompt.video_grid_thw.tolist() == ref["video_grid_thw"].tolist()
        return
    per_frame = "<|vision_start|>" + "<|video_pad|>" * (gh * gw // 4) + "<|vision_end|>"
    # frames 0, 1 | 2, 3 of a list taken at 2 fps: the mean times of each pair, 0.25 s and 1.25 s
    blocks = f"<0.2 seconds>{per_frame}<1.2 seconds>{per_frame}"
    want = text.replace("<|vision_start|><|video_pad|><|vision_end|>", blocks)
    image_pads = [gh_ * gw_ // 4 for _, gh_, gw_ in prompt.image_grid_thw.tolist()]
    pieces = want.split("<|image_pad|>")
    want = pieces[0] + "".join("<|image_pad|>" * n + rest for n, rest in zip(image_pads, pieces[1:]))
    assert prompt.input_ids == p.tokenizer(want)["input_ids"]
    assert prompt.mm_token_type_ids.count(2) == t * gh * gw // 4


def test_three_grpo_steps_on_a_mixed_file_from_the_command_line(tmp_path, mixed_dir, tiny_model_dir, capsys):
    """`vlgrpo train CONFIG` on one file of one-image, two-image and video rows: every kind is drawn, each step's
    images go through one encoder call and its videos through another; a row over data.max_prompt_length (a video of
    12 frames) is skipped and counted in data/overlong_rows, never cut."""
    import json

    from vlgrpo.cli import main
    from vlgrpo.config import save_config
    from vlgrpo.data.video import VideoSampling
    from vlgrpo.models import load_model
    from vlgrpo.policy.prompt import build_prompt
    from vlgrpo.types import Sample

    rows = [json.loads(line) for line in (mixed_dir / "train.jsonl").read_text().splitlines()][:9]
    for r in rows:  # absolute paths: the file is written elsewhere
        for key in ("image", "images", "video"):
            if r.get(key):
                r[key] = [str(mixed_dir / p) for p in r[key]] if isinstance(r[key], list) else str(mixed_dir / r[key])
    video = next(r for r in rows if r.get("video"))
    long = {**video, "id": "long", "video": video["video"] * 3}  # 12 frames: 6 temporal patches, not 2
    model = tiny_model_dir("qwen2_5_vl")
    processor, sampling = load_model(model).processor, VideoSampling(min_pixels=50176, max_pixels=50176)
    lengths = {
        r["id"]: len(
            build_prompt(
                Sample(**{k: v for k, v in r.items() if k != "video"}, video=None)
                if not r.get("video")
                else _with_video(r),
                processor,
                None,
                "answer",
                "qwen2_5",
                "",
                sampling,
            ).input_ids
        )
        for r in [*rows, long]
    }
    limit = max(n for sid, n in lengths.items() if sid != "long")
    assert lengths["long"] - lengths[video["id"]] == 4 * 16 * 16 // 4  # 4 more temporal patches of 64 tokens
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [long, *rows]))
    cfg = tiny_config(
        model,
        mixed_dir,
        tmp_path / "run",
        f"data.train={data}",
        "reward.recipe={accuracy: 1.0}",
        "train.steps=3",
        "train.prompts_per_step=3",
        "rollout.completions_per_prompt=2",
        "train.micro_batch_completions=2",
        "data.video.min_pixels=50176",
        "data.video.max_pixels=50176",
        "data.shuffle=false",
        f"data.max_prompt_length={limit}",
    )
    save_config(cfg, tmp_path / "cfg.yaml")
    assert main(["train", str(tmp_path / "cfg.yaml")]) == 0
    err = capsys.readouterr().err
    assert "(id 'long') skipped (prompt_too_long)" in err and "Traceback" not in err
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [(m["data/skipped_rows"], m["data/overlong_rows"]) for m in metrics] == [(1.0, 1.0)] * 3
    assert sum(m["vision/videos_encoded"] for m in metrics) >= 1 and sum(m["rollout/prompts"] for m in metrics) == 9
    assert all(m["vision/encoder_calls"] <= 2 for m in metrics)  # one for the images, one for the videos
    assert all(m["rollout/encoder_calls"] == 0 for m in metrics)  # the engine hits what the trainer encoded


def _with_video(row):
    from vlgrpo.types import Sample, Video

    return Sample(**{k: v for k, v in row.items() if k != "video"}, video=Video(frames=row["video"]))


def test_a_split_rollout_on_mixed_rows_reproduces_the_colocated_run(tmp_path, mixed_dir, tiny_model_dir):
    """rollout.placement=split with max_staleness=0 on two-image and video rows: the worker adopts the trainer's
    image and video features (it encodes nothing) and the run equals the colocated one exactly."""
    from vlgrpo.trainer.loop import Trainer
    from vlgrpo.trainer.state import build_state

    def run(name, *extra):
        cfg = tiny_config(
            tiny_model_dir("qwen2_5_vl"),
            mixed_dir,
            tmp_path / name,
            "reward.recipe={accuracy: 1.0}",
            "train.steps=2",
            "train.seed=0",
            "data.video.max_pixels=50176",
            *extra,
        )
        state = build_state(cfg, progress=False)
        try:
            return Trainer(state).train()
        finally:
            state.close()

    colocated = run("colocated")
    split = run("split", "rollout.placement=split", "rollout.max_staleness=0")
    keys = ("train/loss", "reward/total", "grpo/response_length", "vision/images_encoded", "vision/videos_encoded")
    for a, b in zip(colocated, split, strict=True):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, a["step"]
    assert sum(h["vision/videos_encoded"] for h in colocated) >= 1
    assert [h["rollout/encoder_calls"] for h in split] == [0.0, 0.0]  # the worker adopted every part


def test_the_vqa_suite_scores_two_image_and_video_rows(tmp_path, mixed_dir, tiny_model_dir):
    """`vlgrpo eval --suite vqa` on a mixed file: every row is prompted and scored, one-image, two-image and video."""
    import json

    from vlgrpo.cli import main

    test = [json.loads(line) for line in (mixed_dir / "train.jsonl").read_text().splitlines()][:6]
    out = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                "--model",
                tiny_model_dir("qwen3_vl"),
                "--suite",
                "vqa",
                "--data",
                str(mixed_dir / "train.jsonl"),
                "--max-samples",
                "6",
                "--max-new-tokens",
                "3",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    doc = json.loads((out / "metrics.json").read_text())
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert doc["counts"]["vqa"] == 6 and [p["id"] for p in preds] == [r["id"] for r in test]
    assert {r["task"] for r in test} == {"shapes/count", "shapes/compare", "shapes/motion"}
    assert doc["info"]["vision_cache"]["videos_encoded"] == 2 and doc["info"]["vision_cache"]["encoder_calls"] == 2


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_a_trainable_towers_update_encodes_images_and_a_video_in_one_call(mixed_dir, tiny_model_dir, arch):
    """#60 item 5: under ZeRO-3 every tower call gathers the tower's shards, so the update pass of a trainable tower
    must call it as often on a rank whose micro-batch holds a video beside images as on one with images only: once.
    The features (and DeepStack maps) equal the two calls' of the rollout's encode, to fp32 rounding."""
    from vlgrpo.data.video import VideoSampling, visual_sources
    from vlgrpo.models import load_model
    from vlgrpo.vision_cache import VisionCache

    lm = load_model(str(tiny_model_dir(arch)))
    rows = load_samples(mixed_dir / "train.jsonl").samples
    compare = next(s for s in rows if len(s.images) == 2)
    clip = visual_sources(next(s for s in rows if s.video is not None), VideoSampling(max_pixels=50176))[0]
    sources = [[*compare.images], [clip]]
    cache = VisionCache(lm.model, lm.processor, trainable=True)
    with torch.no_grad():
        apart = cache.get_rows(sources)  # images, then the video: two calls
        calls = cache.stats()["encoder_calls"]
        together = cache.encode_rows_with_grad(sources)
    assert calls == 2 and cache.stats()["encoder_calls"] == 3  # one call for both
    for a, b in zip([f for r in apart for f in r], [f for r in together for f in r]):
        assert a.video_fps == b.video_fps and torch.equal(a.grid_thw, b.grid_thw)
        assert torch.allclose(a.embeds, b.embeds, atol=1e-5, rtol=0)
        assert (a.deepstack is None) == (b.deepstack is None)
        if a.deepstack is not None:
            assert torch.allclose(a.deepstack, b.deepstack, atol=1e-5, rtol=0)
