"""Videos: which frames the model sees (Qwen's sampling by fps and max_frames), reading them (frame lists need no
codec; video files are decoded with PyAV, the decoder under qwen-vl-utils' torchvision reader, once per process: the
inspection, the frames and the cache key of a file read one decode) and their token count.

Frame sampling follows qwen-vl-utils (`smart_nframes`, indices by `torch.linspace(...).round()`), so a frame count
here is the one Qwen's own pipeline gives. Knows nothing of models or datasets.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from vlgrpo.data.images import ImageError, ProcessorGeometry, inspect_image, load_image
from vlgrpo.data.video_file import VideoError, decoded
from vlgrpo.types import InputError, Video

FRAME_FACTOR = 2
"""Frames come in pairs: the vision tower merges `temporal_patch_size` (2) frames into one (qwen-vl-utils)."""
MIN_FRAMES = 4
"""qwen-vl-utils' FPS_MIN_FRAMES: a file gives at least this many frames when it has them."""
VIDEO_MIN_TOKENS, VIDEO_MAX_TOKENS = 128, 768
"""qwen-vl-utils' default pixel bounds of one video frame, in merged tokens (x factor^2 pixels)."""


@dataclass(frozen=True)
class VideoSampling:
    """How frames are taken from a video (data.video; a row's `video` mapping overrides fps and max_frames)."""

    fps: float = 2.0
    max_frames: int = 32
    min_pixels: int = 0
    """Smallest frame area in pixels; 0: 128 merged tokens' worth (qwen-vl-utils' VIDEO_MIN_TOKEN_NUM)."""
    max_pixels: int = 0
    """Largest frame area in pixels; 0: 768 merged tokens' worth (qwen-vl-utils' VIDEO_MAX_TOKEN_NUM)."""

    def __post_init__(self) -> None:
        for ok, key, why in (
            (self.fps > 0, "fps", "must be > 0"),
            (self.max_frames >= FRAME_FACTOR, "max_frames", f"must be >= {FRAME_FACTOR} (frames come in pairs)"),
            (self.min_pixels >= 0 and self.max_pixels >= 0, "min_pixels/max_pixels", "must be >= 0 (0: Qwen's)"),
            (
                not (self.min_pixels and self.max_pixels) or self.min_pixels <= self.max_pixels,
                "min_pixels",
                "must not exceed data.video.max_pixels",
            ),
        ):
            if not ok:
                raise InputError(f"data.video.{key} {why} (got {self!r})")

    @classmethod
    def from_config(cls, video) -> VideoSampling:
        """From the config's `data.video` section (vlgrpo.config.schema.VideoConfig)."""
        return cls(float(video.fps), int(video.max_frames), int(video.min_pixels or 0), int(video.max_pixels or 0))

    def for_row(self, video: Video) -> VideoSampling:
        """These settings with the row's own fps / max_frames."""
        return replace(self, fps=video.fps or self.fps, max_frames=video.max_frames or self.max_frames)

    def pixel_bounds(self, geometry: ProcessorGeometry) -> tuple[int, int]:
        """(min, max) pixels of one frame: the configured ones, else Qwen's video defaults for this patch size (the
        default min no larger than a configured max)."""
        hi = self.max_pixels or VIDEO_MAX_TOKENS * geometry.factor**2
        lo = self.min_pixels or min(VIDEO_MIN_TOKENS * geometry.factor**2, hi)  # a small max_pixels lowers Qwen's min
        return lo, max(hi, lo)


def _floor2(x: float) -> int:
    return math.floor(x / FRAME_FACTOR) * FRAME_FACTOR


def smart_nframes(total: int, native_fps: float, fps: float, max_frames: int) -> int:
    """Frames taken from a file of `total` frames at `native_fps`: qwen-vl-utils' `smart_nframes` with fps and
    max_frames given (total / native_fps x fps, at least MIN_FRAMES, at most max_frames and total, floored to even)."""
    min_frames = math.ceil(MIN_FRAMES / FRAME_FACTOR) * FRAME_FACTOR
    n = min(min(max(total / native_fps * fps, min_frames), _floor2(max_frames)), total)
    n = _floor2(n)
    if not FRAME_FACTOR <= n <= total:
        raise ValueError(f"{total} frame(s): a video needs at least {FRAME_FACTOR}")
    return n


def linspace_indices(total: int, n: int) -> list[int]:
    """n evenly spaced frame indices over 0..total-1, rounded as qwen-vl-utils rounds them (torch, half to even)."""
    import torch

    return torch.linspace(0, total - 1, n).round().long().tolist()


def file_indices(total: int, native_fps: float, sampling: VideoSampling) -> tuple[list[int], float]:
    """(indices of the frames taken from a file, the rate they represent: n / total x native fps)."""
    n = smart_nframes(total, native_fps, sampling.fps, sampling.max_frames)
    return linspace_indices(total, n), n / total * native_fps


def _taken_by(sampling: VideoSampling):
    """The indices `sampling` takes of a file's (frame count, rate): the frames its decode keeps."""
    return lambda total, native_fps: file_indices(total, native_fps, sampling)[0]


def list_indices(total: int, sampling: VideoSampling) -> tuple[list[int], float]:
    """(indices of the frames taken from a frame list, their rate). Every frame, an odd count padded with the last
    (qwen-vl-utils); above max_frames, that many evenly spaced. The list was taken at `sampling.fps`."""
    if total < 1:
        raise ValueError("an empty frame list")
    if total > sampling.max_frames:
        n = _floor2(sampling.max_frames)
        return linspace_indices(total, n), sampling.fps * n / total
    pad = -total % FRAME_FACTOR
    return list(range(total)) + [total - 1] * pad, sampling.fps


def video_name(video: Video) -> str:
    return f"'{video.path}'" if video.path is not None else f"frame list of {len(video.frames)}"


@dataclass
class VideoInfo:
    """What the model would see of one video, or why it cannot be used."""

    problem: tuple[str, str] | None = None
    """(check, message) when the video cannot be used."""
    indices: list[int] = field(default_factory=list)
    """The frames taken, in order (an index repeats where an odd frame list is padded)."""
    size: tuple[int, int] | None = None
    """(width, height) of a frame."""
    sample_fps: float = 0.0
    """The frame rate the taken frames represent (Qwen2.5-VL's second_per_grid_ts, Qwen3-VL's timestamps)."""
    sampling: VideoSampling = field(default_factory=VideoSampling)
    """The settings it was sampled with (the row's overrides applied)."""
    source_fps: float = 0.0
    """The rate `indices` count in: the file's own frame rate, or the rate a frame list was taken at (Qwen3-VL's
    timestamps are index / source_fps)."""

    def resized_hw(self, geometry: ProcessorGeometry) -> tuple[int, int]:
        """(height, width) every frame is resized to: smart_resize within the video pixel bounds."""
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

        w, h = self.size
        lo, hi = self.sampling.pixel_bounds(geometry)
        try:
            return smart_resize(h, w, geometry.factor, lo, hi)
        except ValueError as e:
            raise ImageError(f"video frames of {w}x{h} px cannot be resized for the model: {e}") from None

    def grid_thw(self, geometry: ProcessorGeometry) -> tuple[int, int, int]:
        """The `video_grid_thw` row: (frames / temporal_patch_size, resized h / patch, resized w / patch), each frame
        resized by smart_resize within the video pixel bounds."""
        rh, rw = self.resized_hw(geometry)
        return len(self.indices) // geometry.temporal_patch_size, rh // geometry.patch_size, rw // geometry.patch_size

    def num_tokens(self, geometry: ProcessorGeometry) -> int:
        """Language-model tokens of the video (<|video_pad|> count): temporal groups x tokens per frame."""
        t, gh, gw = self.grid_thw(geometry)
        return t * gh * gw // geometry.merge_size**2


def inspect_video(video: Video, sampling: VideoSampling) -> VideoInfo:
    """Which frames of the video the model would see, checked: a file decoded to the end (keeping the frames taken, for
    `read_video`), every frame of a list decoded and of one size. What `vlgrpo data doctor` (and, later, training)
    decide a row's video by."""
    sampling = sampling.for_row(video)
    try:
        if video.path is not None:
            file = decoded(video.path, _taken_by(sampling), frames=False)
            indices, fps = file_indices(file.total, file.fps, sampling)
            return VideoInfo(None, indices, file.size, fps, sampling, file.fps)
        infos = [inspect_image(f) for f in video.frames]
        bad = next((i for i, info in enumerate(infos) if info.problem is not None), None)
        if bad is not None:
            check, message = infos[bad].problem
            check = "video_frame_" + check.removeprefix("image_")  # video_frame_missing, ..._corrupt, ...
            return VideoInfo((check, f"frame {bad} of the video: {message}"), sampling=sampling)
        sizes = sorted({info.decoded for info in infos})
        if len(sizes) > 1:
            listed = ", ".join(f"{w}x{h}" for w, h in sizes)
            message = f"the video's frames differ in size ({listed}): give frames of one size"
            return VideoInfo(("video_frame_sizes", message), sampling=sampling)
        indices, fps = list_indices(len(infos), sampling)
        return VideoInfo(None, indices, sizes[0], fps, sampling, sampling.fps)
    except VideoError as e:
        check = "video_missing" if "does not exist" in str(e) else "video_corrupt"
        return VideoInfo((check, str(e)), sampling=sampling)
    except ValueError as e:  # fewer than 2 frames
        return VideoInfo(("video_too_short", f"video {video_name(video)}: {e}"), sampling=sampling)


@dataclass
class SampledVideo:
    frames: list
    """The taken frames as RGB PIL images, not resized (the processor resizes them)."""
    fps: float
    """The rate they represent."""
    indices: list[int]
    source_fps: float = 0.0
    """The rate `indices` count in (a file's own rate; a frame list's)."""


def read_video(video: Video, sampling: VideoSampling) -> SampledVideo:
    """The frames the model sees of a video (of a file, those its one decode in this process kept; a frame list
    loaded as images)."""
    sampling = sampling.for_row(video)
    try:
        if video.path is not None:
            file = decoded(video.path, _taken_by(sampling), frames=True)
            indices, fps = file_indices(file.total, file.fps, sampling)
            return SampledVideo([file.frames[i] for i in indices], fps, indices, file.fps)
        indices, fps = list_indices(len(video.frames), sampling)
        loaded = {i: load_image(video.frames[i]) for i in sorted(set(indices))}
    except VideoError:
        raise
    except ValueError as e:  # fewer than 2 frames, or a frame that does not decode (ImageError)
        raise VideoError(f"video {video_name(video)}: {e}") from None
    return SampledVideo([loaded[i] for i in indices], fps, indices, sampling.fps)


def frame_timestamps(indices: list[int], source_fps: float, temporal_patch_size: int) -> list[float]:
    """Seconds of each temporal patch, as Qwen3-VL writes them before its frames (`<1.2 seconds>`): the mean time of
    the first and last frame the patch merges (an odd count padded with the last index, as its processor does)."""
    idx = list(indices) + [indices[-1]] * (-len(indices) % temporal_patch_size)
    t = [i / source_fps for i in idx]
    return [(t[i] + t[i + temporal_patch_size - 1]) / 2 for i in range(0, len(t), temporal_patch_size)]


class VideoClip:
    """A row's video under given sampling settings: what a prompt counts tokens and timestamps from and what the
    vision cache keys and encodes. A file's one decode in this process (`video_file.decoded`) gives its inspection,
    its frames and so its content hash; the inspection and the hash are also kept per file state and settings (a file
    that changes on disk is read again), so a file whose frames that memory let go (`video_file.DECODED_BUDGET`) is
    decoded again for its frames alone."""

    _memo: dict[tuple, tuple] = {}

    def __init__(self, video: Video, sampling: VideoSampling):
        self.video = video
        self.sampling = sampling.for_row(video)

    def _ident(self) -> tuple:
        def state(src):
            if isinstance(src, bytes):
                return hashlib.sha256(src).hexdigest()
            st = Path(src).stat() if Path(src).is_file() else None
            return (str(src), st.st_mtime_ns, st.st_size) if st else (str(src), None)

        sources = [self.video.path] if self.video.path is not None else self.video.frames
        return (tuple(state(s) for s in sources), self.sampling)

    def info(self) -> VideoInfo:
        """The inspection (`inspect_video`); raises VideoError when the video cannot be used."""
        key = ("info", self._ident())
        if key not in self._memo:
            self._memo[key] = (inspect_video(self.video, self.sampling),)
        info = self._memo[key][0]
        if info.problem is not None:
            raise VideoError(info.problem[1])
        return info

    def read(self) -> SampledVideo:
        return read_video(self.video, self.sampling)

    def resized_frames(self, geometry: ProcessorGeometry) -> list:
        """The taken frames resized (bicubic) to the size the model sees, as qwen-vl-utils resizes them before the
        processor; the processor then only normalises and patchifies."""
        from PIL import Image

        h, w = self.info().resized_hw(geometry)
        return [f.resize((w, h), Image.Resampling.BICUBIC) for f in self.read().frames]

    def sha256(self, geometry: ProcessorGeometry) -> str:
        """Content hash of the frames the model sees at `geometry` (decoded RGB bytes of each taken frame, its size)
        and the settings that took them (indices, rate, pixel bounds)."""
        key = ("sha", self._ident(), geometry)
        if key not in self._memo:
            info = self.info()
            h = hashlib.sha256()
            h.update(repr((info.indices, info.sample_fps, info.source_fps, info.resized_hw(geometry))).encode())
            for frame in self.read().frames:
                h.update(f"{frame.size}|".encode())
                h.update(frame.tobytes())
            self._memo[key] = (h.hexdigest(),)
        return self._memo[key][0]

    def __repr__(self) -> str:
        return f"VideoClip({video_name(self.video)})"


def visual_sources(sample, sampling: VideoSampling) -> list:
    """A sample's visual inputs in the order their features are injected: its images (in `images` order), then its
    video as a VideoClip. Images and videos fill separate placeholder runs, so this order holds wherever the
    question's markers put them."""
    return [*sample.images, *([VideoClip(sample.video, sampling)] if sample.video is not None else [])]
