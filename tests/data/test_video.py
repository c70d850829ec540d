"""Reading videos: frame sampling as qwen-vl-utils samples (fps, max_frames, pairs of frames), real decoding of MP4 and
GIF files with PyAV, frame lists without any codec, and clear errors naming the file."""

import json
import sys

import numpy as np
import pytest
from PIL import Image
from video_files import write_gif, write_mp4

from vlgrpo.data.images import DEFAULT_GEOMETRY, ProcessorGeometry
from vlgrpo.data.video import (
    VideoError,
    VideoSampling,
    file_indices,
    inspect_video,
    list_indices,
    read_video,
    smart_nframes,
)
from vlgrpo.types import InputError, Video


def test_frame_count_matches_qwen_vl_utils():
    qwen = pytest.importorskip("qwen_vl_utils.vision_process")
    cases = 0
    for total in (2, 3, 5, 7, 16, 31, 90, 301):
        for native in (1.0, 7.5, 24.0, 29.97, 30.0):
            for fps in (0.5, 1.0, 2.0, 4.0):
                for max_frames in (2, 3, 8, 32):
                    try:
                        want = qwen.smart_nframes({"fps": fps, "max_frames": max_frames}, total, native)
                    except ValueError:
                        with pytest.raises(ValueError):
                            smart_nframes(total, native, fps, max_frames)
                        continue
                    assert smart_nframes(total, native, fps, max_frames) == want, (total, native, fps, max_frames)
                    cases += 1
    assert cases > 500
    # by hand: 3 s at 10 fps sampled at 2 fps -> 6 frames; 1 s -> Qwen's 4 at least; 10 s -> max_frames 8
    assert [smart_nframes(t, 10, 2.0, 8) for t in (30, 10, 100)] == [6, 4, 8]


def test_indices_and_rates():
    assert file_indices(30, 10.0, VideoSampling()) == ([0, 6, 12, 17, 23, 29], 2.0)  # linspace 0..29, half to even
    assert list_indices(5, VideoSampling(fps=1.0)) == ([0, 1, 2, 3, 4, 4], 1.0)  # odd: the last frame repeated
    assert list_indices(5, VideoSampling(max_frames=4)) == ([0, 1, 3, 4], 1.6)  # 4 of 5, taken at 2 fps -> 1.6
    assert list_indices(1, VideoSampling()) == ([0, 0], 2.0)


def test_an_mp4_file_is_decoded_and_sampled(tmp_path):
    write_mp4(tmp_path / "v.mp4", 30)  # 3 s at 10 fps
    info = inspect_video(Video(path=str(tmp_path / "v.mp4")), VideoSampling())
    assert info.problem is None and info.indices == [0, 6, 12, 17, 23, 29] and info.size == (64, 48)
    got = read_video(Video(path=str(tmp_path / "v.mp4")), VideoSampling())
    grey = [float(np.asarray(f).mean()) for f in got.frames]
    assert got.fps == 2.0 and len(got.frames) == 6 and got.frames[0].size == (64, 48)
    assert [round(g / 8) for g in grey] == got.indices  # the sampled frames, in order (nearest grey: lossy codec)
    # a row's own fps and max_frames: 1 fps -> 3 frames, at least Qwen's 4; max_frames 2 -> the ends
    assert read_video(Video(path=str(tmp_path / "v.mp4"), fps=1.0), VideoSampling()).indices == [0, 10, 19, 29]
    assert read_video(Video(path=str(tmp_path / "v.mp4"), max_frames=2), VideoSampling()).indices == [0, 29]


def test_a_gif_and_a_frame_list_give_exact_frames(tmp_path):
    write_gif(tmp_path / "g.gif", 7)  # 0.7 s at 10 fps: Qwen takes 4 of 7 frames
    got = read_video(Video(path=str(tmp_path / "g.gif")), VideoSampling())
    assert got.indices == [0, 2, 4, 6] and [f.getpixel((0, 0))[0] for f in got.frames] == [0, 40, 80, 120]
    frames = []
    for i in range(3):
        frames.append(str(tmp_path / f"f{i}.png"))
        Image.new("RGB", (20, 10), (0, 50 * i, 0)).save(frames[-1])
    got = read_video(Video(frames=frames, fps=4.0), VideoSampling())
    assert got.fps == 4.0 and [f.getpixel((0, 0))[1] for f in got.frames] == [0, 50, 100, 100]


def test_video_tokens_by_hand(tmp_path):
    write_mp4(tmp_path / "v.mp4", 30)
    info = inspect_video(Video(path=str(tmp_path / "v.mp4")), VideoSampling())
    # 64x48 frames below the video minimum of 128 tokens (100,352 px): scaled by sqrt(100352 / 3072) = 5.72 and
    # rounded up to multiples of 28 -> 280 x 392 px = 20 x 28 patches = 140 tokens per frame; 6 frames -> 3 x 140
    assert info.grid_thw(DEFAULT_GEOMETRY) == (3, 20, 28) and info.num_tokens(DEFAULT_GEOMETRY) == 420
    small = inspect_video(Video(path=str(tmp_path / "v.mp4")), VideoSampling(max_pixels=28 * 28 * 4))
    assert small.num_tokens(DEFAULT_GEOMETRY) == 3 * 4  # 64x48 -> 56x56 (max 4 tokens; the default min follows)
    qwen3 = ProcessorGeometry(patch_size=16)  # 32 px tokens, minimum 128 x 32^2 px: x 6.53 -> 320 x 448 px
    assert info.grid_thw(qwen3) == (3, 20, 28) and info.num_tokens(qwen3) == 3 * 10 * 14


def test_unusable_videos_are_named(tmp_path, monkeypatch):
    assert inspect_video(Video(path=str(tmp_path / "nope.mp4")), VideoSampling()).problem == (
        "video_missing",
        f"video file '{tmp_path / 'nope.mp4'}' does not exist",
    )
    (tmp_path / "bad.mp4").write_bytes(b"this is not a video")
    check, message = inspect_video(Video(path=str(tmp_path / "bad.mp4")), VideoSampling()).problem
    assert check == "video_corrupt" and "bad.mp4' cannot be decoded" in message and "H.264 MP4" in message
    with pytest.raises(VideoError, match="bad.mp4"):
        read_video(Video(path=str(tmp_path / "bad.mp4")), VideoSampling())
    write_gif(tmp_path / "one.gif", 1)
    assert inspect_video(Video(path=str(tmp_path / "one.gif")), VideoSampling()).problem[0] == "video_too_short"
    Image.new("RGB", (20, 10)).save(tmp_path / "a.png")
    Image.new("RGB", (10, 20)).save(tmp_path / "b.png")
    frames = [str(tmp_path / "a.png"), str(tmp_path / "b.png"), str(tmp_path / "c.png")]
    assert inspect_video(Video(frames=frames), VideoSampling()).problem[0] == "video_frame_missing"
    assert inspect_video(Video(frames=frames[:2]), VideoSampling()).problem == (
        "video_frame_sizes",
        "the video's frames differ in size (10x20, 20x10): give frames of one size",
    )
    monkeypatch.setitem(sys.modules, "av", None)  # no decoder installed: the extra to install is named
    with pytest.raises(VideoError, match=r"bad.mp4.*pip install av"):
        read_video(Video(path=str(tmp_path / "bad.mp4")), VideoSampling())


def test_sampling_settings_are_checked():
    with pytest.raises(InputError, match=r"data.video.fps must be > 0"):
        VideoSampling(fps=0)
    with pytest.raises(InputError, match=r"data.video.max_frames must be >= 2"):
        VideoSampling(max_frames=1)
    assert VideoSampling(fps=2.0).for_row(Video(path="x", fps=0.5, max_frames=4)) == VideoSampling(0.5, 4)


def _video_run(folder, model_dir: str, cache_dir) -> dict:
    """One GRPO step of the tiny model on a one-row file whose row is a video file; its metrics row."""
    from vlgrpo.config import load_config
    from vlgrpo.trainer.loop import Trainer
    from vlgrpo.trainer.state import build_state

    row = {"id": "clip", "question": "What happens?", "answer": "grey", "video": "v.mp4"}
    (folder / "train.jsonl").write_text(json.dumps(row) + "\n")
    overrides = [
        f"model.name_or_path={model_dir}",
        f"data.train={folder / 'train.jsonl'}",
        "data.answer_format=answer",
        "rollout.completions_per_prompt=2",
        "rollout.max_new_tokens=4",
        "train.prompts_per_step=1",
        "train.micro_batch_completions=2",
        "train.steps=1",
        f"train.output_dir={folder / 'run'}",
        f"rollout.vision_cache_dir={cache_dir}",
        "logging.progress_bar=false",
    ]
    state = build_state(load_config(None, overrides), progress=False)
    try:
        (metrics,) = Trainer(state).train()
    finally:
        state.close()
    return metrics


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """The paths PyAV opens from here on: one decode of a file each."""
    av = pytest.importorskip("av")
    paths, real_open = [], av.open
    monkeypatch.setattr(av, "open", lambda path, *a, **kw: paths.append(path) or real_open(path, *a, **kw))
    return paths


def test_a_video_file_is_decoded_once_per_process(tmp_path, tiny_model_dir, opened):
    """A training step checks the drawn row (inspection), builds its prompt, keys the vision cache by the frames'
    content and encodes them: one decode of the file for all four (there were six). A new process (here: the same
    frames in another file) decodes it once, for its key too, and reads the features from the disk cache (there were
    four decodes)."""
    model, cache = tiny_model_dir("qwen2_5_vl"), tmp_path / "cache"
    first, again = tmp_path / "first", tmp_path / "again"
    first.mkdir(), again.mkdir()
    write_mp4(first / "v.mp4", 30)
    (again / "v.mp4").write_bytes((first / "v.mp4").read_bytes())
    opened.clear()
    metrics = _video_run(first, model, cache)
    assert len(opened) == 1 and metrics["vision/videos_encoded"] == 1
    opened.clear()
    metrics = _video_run(again, model, cache)
    assert len(opened) == 1 and metrics["vision/disk_hits"] == 1 and metrics["vision/encoder_calls"] == 0


def test_a_header_that_miscounts_costs_a_decode_never_a_frame(tmp_path, monkeypatch, opened):
    """The one decode keeps the frames taken of the count the container declares; when the decoded count differs, the
    frames are decoded again, never guessed. A file rewritten on disk is decoded again."""
    from vlgrpo.data import video_file

    write_mp4(tmp_path / "v.mp4", 30)
    video = Video(path=str(tmp_path / "v.mp4"))
    header = video_file._header_frames
    monkeypatch.setattr(video_file, "_header_frames", lambda stream, fps: 20)  # 30 frames declared as 20
    opened.clear()
    assert inspect_video(video, VideoSampling()).indices == [0, 6, 12, 17, 23, 29] and len(opened) == 1
    got = read_video(video, VideoSampling())
    assert [round(float(np.asarray(f).mean()) / 8) for f in got.frames] == got.indices and len(opened) == 2
    monkeypatch.setattr(video_file, "_header_frames", header)
    write_mp4(tmp_path / "v.mp4", 10)  # 1 s now: Qwen's 4 frames
    opened.clear()
    assert read_video(video, VideoSampling()).indices == [0, 3, 6, 9] and len(opened) == 1
