"""Small video files written for the tests: an MPEG-4 file (a codec every FFmpeg build has) and a GIF."""

import numpy as np
import pytest
from PIL import Image


def write_mp4(path, frames: int, fps: int = 10, size=(64, 48)) -> None:
    """An MPEG-4 file whose frame i is a flat grey of value 8 i."""
    av = pytest.importorskip("av")
    w, h = size
    with av.open(str(path), "w") as c:
        stream = c.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((h, w, 3), 8 * i, np.uint8), format="rgb24")
            c.mux(stream.encode(frame))
        c.mux(stream.encode())


def write_gif(path, frames: int, ms: int = 100, size=(40, 30)) -> None:
    """A GIF whose frame i is pure red of value 20 i (palette colours: decoded exactly)."""
    images = [Image.new("RGB", size, (20 * i, 0, 0)) for i in range(frames)]
    images[0].save(path, save_all=True, append_images=images[1:], duration=ms, loop=0)
