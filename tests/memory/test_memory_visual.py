"""The planner's visual tokens: several images per sample and a video's frames grow the prompt, the tower's patches, the
step's cached features, the KV cache and (checkpointed whole rows) the logits. Every expected value is by hand."""

import json
from dataclasses import replace

import pytest

from vlgrpo.cli import main
from vlgrpo.config import load_config
from vlgrpo.data.images import DEFAULT_GEOMETRY
from vlgrpo.data.video import VideoInfo, VideoSampling
from vlgrpo.memory import MODEL_TABLE, PlanError, PlanInput, plan
from vlgrpo.memory.from_config import plan_input_from_config

Q7 = MODEL_TABLE["Qwen/Qwen2.5-VL-7B-Instruct"]
Q3_8B = MODEL_TABLE["Qwen/Qwen3-VL-8B-Instruct"]
KV_Q7 = 2 * 28 * 4 * 128 * 2  # K and V bytes per token: 2 x layers x kv heads x head dim x bf16
ACT_Q7 = 196_608  # activation bytes per token per decoder layer (test_memory_planner)


def run_json(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_two_images_give_twice_the_image_tokens_everywhere():
    one = PlanInput(
        spec=Q7,
        micro_batch=4,
        prompts_per_step=2,
        completions_per_prompt=8,
        text_tokens=64,
        image_tokens=256,
        completion_tokens=128,
        vision_cache_bytes=0,
    )
    two = replace(one, images_per_sample=2)
    p1, p2 = plan(one), plan(two)
    assert p1["counts"]["prompt_parts"]["images"] == 256 and p2["counts"]["prompt_parts"]["images"] == 2 * 256
    assert (p1["counts"]["prompt_tokens"], p2["counts"]["prompt_tokens"]) == (64 + 256, 64 + 512)
    g = p2["per_gpu"]
    assert g["kv_cache"] == KV_Q7 * 2 * (576 + 8 * 128)  # B x (P + G x C), the prompt once per group
    assert g["activations"] == ACT_Q7 * 4 * (576 + 128) * 28
    assert g["vision_cache"] == 2 * 512 * 3584 * 2  # B prompts x 512 visual tokens x hidden x bf16
    assert g["kv_cache"] - p1["per_gpu"]["kv_cache"] == KV_Q7 * 2 * 256  # the second image's 256 tokens per prompt
    assert plan(replace(one, images_per_sample=0))["counts"]["prompt_tokens"] == 64  # a text-only (or video) row


def test_a_16_frame_video_is_8_temporal_patches_of_its_frame_tokens():
    n = 768  # qwen-vl-utils' default bound: 768 merged tokens a frame
    inp = PlanInput(
        spec=Q7,
        micro_batch=4,
        prompts_per_step=2,
        completions_per_prompt=8,
        text_tokens=64,
        image_tokens=256,
        images_per_sample=1,
        video_frames=16,
        video_frame_tokens=n,
        completion_tokens=128,
        vision_cache_bytes=0,
    )
    p = plan(inp)
    assert p["counts"]["prompt_parts"] == {"text": 64, "images": 256, "video": 8 * n, "video_timestamps": 0}
    prompt = 64 + 256 + 8 * n  # 6464
    assert p["counts"]["prompt_tokens"] == prompt and p["counts"]["visual_tokens"] == 256 + 8 * n
    g = p["per_gpu"]
    # each of these fails when the video term is dropped
    assert g["kv_cache"] == KV_Q7 * 2 * (prompt + 8 * 128)
    assert g["activations"] == ACT_Q7 * 4 * (prompt + 128) * 28
    assert g["vision_cache"] == 2 * (256 + 8 * n) * 3584 * 2
    assert p["counts"]["sequence_tokens"] == prompt + 128
    # an odd frame count is padded with the last frame: 15 frames make 8 temporal patches too
    assert plan(replace(inp, video_frames=15))["counts"]["prompt_parts"]["video"] == 8 * n


def test_the_trainable_tower_sees_every_image_and_every_frame():
    s = MODEL_TABLE["Qwen/Qwen2-VL-2B-Instruct"]
    inp = PlanInput(
        spec=s,
        trainable=("vision", "merger", "language"),
        micro_batch=1,
        text_tokens=0,
        image_tokens=4,
        images_per_sample=2,
        video_frames=4,
        video_frame_tokens=3,
        completion_tokens=4,
    )
    visual = 2 * 4 + 2 * 3  # two images of 4 tokens, 4 frames = 2 temporal patches of 3 tokens
    lm = 2 * (6 * 1536 + 2 * 256 + 4 * 8960) * (visual + 4) * 28
    vit = 2 * (8 * 1280 + 2 * 5120) * (visual * 4) * 32  # 4 patches per merged token, GELU MLP
    assert plan(inp)["per_gpu"]["activations"] == lm + vit


def test_checkpointed_whole_rows_keep_the_visual_tokens_out_of_the_logits():
    inp = PlanInput(
        spec=Q7,
        micro_batch=4,
        text_tokens=64,
        image_tokens=256,
        images_per_sample=2,
        video_frames=16,
        video_frame_tokens=768,
        completion_tokens=512,
        gradient_checkpointing=True,
    )
    # a 6,720-token prompt (64 + 2 x 256 + 8 x 768), forwarded whole under checkpointing: its positions never reach
    # the LM head (logits_to_keep), so the logits are the completion's alone, as in the shared-prefix pass
    assert plan(inp)["per_gpu"]["logits"] == 4 * 512 * 152064 * 10
    assert plan(replace(inp, gradient_checkpointing=False))["per_gpu"]["logits"] == 4 * 512 * 152064 * 10


def test_qwen3_vl_video_adds_its_timestamps():
    inp = PlanInput(
        spec=Q3_8B, text_tokens=64, image_tokens=196, images_per_sample=0, video_frames=16, video_frame_tokens=768
    )
    parts = plan(inp)["counts"]["prompt_parts"]
    assert parts == {"text": 64, "images": 0, "video": 8 * 768, "video_timestamps": 8 * 8}  # `<t seconds>` + wrap


def test_bad_visual_inputs_are_named():
    with pytest.raises(PlanError, match="images per sample"):
        plan(PlanInput(spec=Q7, images_per_sample=-1))
    with pytest.raises(PlanError, match="tokens per frame"):
        plan(PlanInput(spec=Q7, video_frames=8))


def test_config_prices_frames_with_data_video():
    base = ["model.name_or_path=Qwen/Qwen2.5-VL-7B-Instruct", "model.dtype=bfloat16"]
    inp = plan_input_from_config(load_config(None, base), images_per_sample=2, video_frames=16)
    assert (inp.images_per_sample, inp.image_tokens, inp.video_frames, inp.video_frame_tokens) == (2, 256, 16, 768)
    small = load_config(None, base + ["data.video.max_pixels=200704", "data.video.max_frames=8"])
    inp = plan_input_from_config(small, video_frames=16)
    # 200,704 px = 256 tokens of 28 x 28 px; 8 frames at most
    assert (inp.video_frames, inp.video_frame_tokens) == (8, 256)
    assert plan(inp)["counts"]["prompt_parts"]["video"] == 4 * 256
    q3 = plan_input_from_config(load_config(None, ["model.name_or_path=qwen3-vl-8b"]), video_frames=4)
    assert q3.video_frame_tokens == 768  # 768 tokens of 32 x 32 px: Qwen3-VL's bound is 786,432 px


def test_frame_size_prices_like_the_data_layer():
    """--video-size: the same smart_resize within the video bounds as `VideoInfo.num_tokens`, which the doctor and the
    trainer's length check count with."""
    cfg = load_config(None, ["model.name_or_path=Qwen/Qwen2.5-VL-7B-Instruct"])
    for size, frames in (((640, 360), 16), ((896, 672), 16), ((64, 64), 4)):
        inp = plan_input_from_config(cfg, video_frames=frames, video_size=size)
        info = VideoInfo(indices=list(range(frames)), size=size, sampling=VideoSampling())
        assert plan(inp)["counts"]["prompt_parts"]["video"] == info.num_tokens(DEFAULT_GEOMETRY)
    # 640 x 360 -> 644 x 364: 23 x 13 = 299 tokens; 896 x 672 is the bound itself (32 x 24 = 768); 64 x 64 is raised
    # above the 128-token minimum (100,352 px): 64 x sqrt(100352 / 4096) = 316.8 px, up to 336 = 12 x 28: 144 tokens
    tokens = [
        plan_input_from_config(cfg, video_frames=2, video_size=s).video_frame_tokens
        for s in ((640, 360), (896, 672), (64, 64))
    ]
    assert tokens == [299, 768, 144]


def test_cli_flags_and_the_headline(capsys):
    r = run_json(capsys, "--model", "qwen2.5-vl-7b", "--images-per-sample", "2", "--video-frames", "16")
    assert r["counts"]["prompt_parts"] == {"text": 64, "images": 512, "video": 6144, "video_timestamps": 0}
    assert r["inputs"]["video_frame_tokens"] == 768 and r["counts"]["prompt_tokens"] == 6720
    assert any("data/overlong_rows" in w for w in r["warnings"])  # 6720 > data.max_prompt_length=1024
    r = run_json(capsys, "--model", "qwen2.5-vl-7b", "--video-frames", "16", "--video-max-pixels", "200704")
    assert r["inputs"]["video_frame_tokens"] == 256 and r["counts"]["prompt_parts"]["video"] == 8 * 256
    assert main(["plan", "--model", "qwen2.5-vl-7b", "--images-per-sample", "2", "--video-frames", "40"]) == 0
    out = capsys.readouterr().out
    assert "tokens: 64 text + 2 images x 256 + video 16 x 768 (32 frames) = 12864 prompt + 128 completion" in out
    assert "note: --video-frames 40 is more than data.video.max_frames=32: the model sees 32" in out
    assert main(["plan", "--model", "qwen2.5-vl-7b"]) == 0
    assert "tokens: 64 text + 256 image + 128 completion" in capsys.readouterr().out  # one image: as before
    assert main(["plan", "--params", "1e9", "--video-frames", "-2"]) == 2
    assert "--video-frames -2: must be >= 0" in capsys.readouterr().err
    assert main(["plan", "--params", "1e9", "--video-frames", "4", "--video-size", "wide"]) == 2
    assert "--video-size 'wide' must look like WIDTHxHEIGHT" in capsys.readouterr().err
