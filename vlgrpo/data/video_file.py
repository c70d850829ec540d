"""Video files decoded with PyAV (the decoder under qwen-vl-utils' torchvision reader), once per file per process: the
decode keeps the file's frame count, rate and size and the frames the caller takes, so a file's inspection, its frames
and its cache key all read one decode. Knows nothing of sampling: the caller says which frames a count takes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from vlgrpo.types import InputError

NO_DECODER = (
    "reading video files needs PyAV, the decoder qwen-vl-utils' torchvision reader runs on: `pip install "
    "av` (qwen-vl-utils depends on it); or give the video as a list of frame image files"
)
DECODED_BUDGET = 2**30
"""Bytes of decoded frames a process keeps (`_DecodedFiles`), 1 GiB: the taken frames of 32-frame videos are 88 MB at
1280x720 (12 files fit), 22 MB at 640x360 (48 files). Past it the least recently used file goes; the newest stays."""

Pick = Callable[[int, float], list[int]]
"""(frame count, frame rate) -> the indices a sampling takes; raises ValueError when the count is too small."""


class VideoError(InputError):
    """A video that cannot be used; the message names the file and what to do."""


@dataclass(frozen=True)
class DecodedFile:
    """One decode of a file: what its inspection, its frames and its cache key are read from afterwards."""

    total: int
    """Frames decoded (counted, as torchvision's reader did, not taken from the container's header)."""
    fps: float
    size: tuple[int, int]
    """(width, height) of a frame."""
    frames: dict
    """{index: RGB PIL image} of the frames kept: those a sampling takes, not resized."""

    @property
    def nbytes(self) -> int:
        return sum(f.width * f.height * 3 for f in self.frames.values())


class _DecodedFiles:
    """The files this process decoded, by (resolved path, size, mtime): a file changed on disk is decoded again. An LRU
    of at most `budget` bytes of frames (the newest file always stays, whatever its size) and `max_files` files."""

    def __init__(self, budget: int, max_files: int = 4096) -> None:
        self.budget, self.max_files = budget, max_files
        self._files: OrderedDict[tuple, DecodedFile] = OrderedDict()
        self._bytes = 0

    def get(self, state: tuple | None) -> DecodedFile | None:
        if state not in self._files:
            return None
        self._files.move_to_end(state)
        return self._files[state]

    def put(self, state: tuple | None, entry: DecodedFile) -> None:
        if state is None:
            return
        old = self._files.pop(state, None)
        self._bytes += entry.nbytes - (old.nbytes if old else 0)
        self._files[state] = entry
        while len(self._files) > 1 and (self._bytes > self.budget or len(self._files) > self.max_files):
            self._bytes -= self._files.popitem(last=False)[1].nbytes


_DECODED = _DecodedFiles(DECODED_BUDGET)


def decoded(path: str, pick: Pick, frames: bool) -> DecodedFile:
    """A video file as this process decoded it: decoded now if it has not been (or has changed on disk), keeping the
    frames `pick` takes. `frames`: those frames must be kept; a file decoded for other settings, or whose header
    miscounted its frames, is then decoded again for them. Raises VideoError for a file that does not decode,
    ValueError (from `pick`) for one with too few frames."""
    state = _file_state(path)
    entry = _DECODED.get(state) or _decode(path, pick)
    _DECODED.put(state, entry)
    if frames and not entry.frames.keys() >= set(pick(entry.total, entry.fps)):
        entry = replace(entry, frames={**entry.frames, **_decode(path, pick, entry.total).frames})
        _DECODED.put(state, entry)
    return entry


def _decode(path: str, pick: Pick, total: int = 0) -> DecodedFile:
    """Decode every frame of a file once, keeping those `pick` takes of `total` frames when an earlier decode counted
    them, else of the count the container's header declares (a guess, which `decoded` checks against the count)."""
    container = _container(path)
    kept, count, size = {}, 0, None
    try:
        with container:
            stream = container.streams.video[0] if container.streams.video else None
            if stream is None:
                raise VideoError(f"video file '{path}' has no video stream")
            fps = float(stream.average_rate or 0)
            keep = _taken(pick, total or _header_frames(stream, fps), fps)
            for frame in container.decode(stream):
                size = size or (frame.width, frame.height)
                if count in keep:
                    kept[count] = frame.to_image().convert("RGB")
                count += 1
    except VideoError:
        raise
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt stream fails inside the decode loop
        raise VideoError(
            f"video file '{path}' cannot be decoded to the end ({type(e).__name__}: {e}); convert it "
            "to an H.264 MP4, or give its frames as image files"
        ) from None
    if count == 0 or size is None or fps <= 0:
        raise VideoError(f"video file '{path}' holds no decodable frame (or no frame rate)")
    return DecodedFile(count, fps, size, kept)


def _container(path: str):
    try:
        import av
    except ImportError:
        raise VideoError(f"video {path!r}: {NO_DECODER}") from None
    if not Path(path).is_file():
        raise VideoError(f"video file '{path}' does not exist")
    try:
        return av.open(path)
    except Exception as e:  # noqa: BLE001 - av raises its own FFmpeg error classes (InvalidDataError, ...)
        raise VideoError(
            f"video file '{path}' cannot be decoded ({type(e).__name__}: {e}); convert it to an H.264 "
            "MP4, or give its frames as image files"
        ) from None


def _file_state(path: str) -> tuple | None:
    """(resolved path, size, mtime) of a file; None when there is none."""
    p = Path(path)
    if not p.is_file():
        return None
    st = p.stat()
    return str(p.resolve()), st.st_size, st.st_mtime_ns


def _header_frames(stream, fps: float) -> int:
    """The frame count the container declares, else its duration x rate; 0 when it gives neither."""
    if stream.frames:
        return int(stream.frames)
    seconds = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else 0.0
    return round(seconds * fps)


def _taken(pick: Pick, total: int, fps: float) -> set[int]:
    """The indices `pick` takes of `total` frames; none when there are too few (or no rate) to take any."""
    try:
        return set(pick(total, fps)) if total > 0 and fps > 0 else set()
    except ValueError:
        return set()
