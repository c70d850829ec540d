"""Every distinct image and video of a dataset decoded once (`vlgrpo data doctor`'s second pass): images in threads,
keyed by path or by the bytes' hash; videos keyed with their own sampling overrides. Knows nothing of the checks.
"""

from __future__ import annotations

import hashlib

from vlgrpo.data.images import inspect_image
from vlgrpo.data.video import VideoInfo, VideoSampling, inspect_video
from vlgrpo.types import Video


def inspect_images(images: list, workers: int = 8, progress: bool = False, desc: str = "images") -> dict:
    """{image key: ImageInfo} of each distinct image (a path, or the bytes' hash), decoded in `workers` threads
    (Pillow releases the GIL while it reads and decodes)."""
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    unique = {}
    for image in images:
        unique.setdefault(image_key(image), image)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        infos = list(
            tqdm(
                pool.map(inspect_image, unique.values()),
                total=len(unique),
                desc=desc,
                unit="image",
                disable=not progress,
                leave=False,
            )
        )
    return dict(zip(unique, infos))


def image_key(image: str | bytes) -> str:
    return image if isinstance(image, str) else "sha256:" + hashlib.sha256(image).hexdigest()


def video_key(video: Video) -> str:
    """A video and its own sampling overrides (the same file sampled at another fps is another video)."""
    source = video.path if video.path is not None else "|".join(image_key(f) for f in video.frames)
    return f"{source}@{video.fps}/{video.max_frames}"


def inspect_videos(videos: list[Video], sampling: VideoSampling) -> dict[str, VideoInfo]:
    """{video key: VideoInfo} of each distinct video, decoded once each."""
    unique: dict[str, Video] = {}
    for video in videos:
        unique.setdefault(video_key(video), video)
    return {key: inspect_video(video, sampling) for key, video in unique.items()}
