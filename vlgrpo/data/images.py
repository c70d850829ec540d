"""Images: robust loading (EXIF, every colour mode), content hashing, and Qwen's resize geometry.

The resize geometry comes from the processor's own `smart_resize` (never re-derived here), so image-token
counts and box conversions agree with what the model sees; DEFAULT_GEOMETRY (the released processors') is the one
default every layer uses. Knows nothing of models or datasets.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

from vlgrpo.families import FAMILIES
from vlgrpo.types import InputError


class ImageError(InputError):
    """An image that cannot be used; the message names the source and what is wrong."""


def _describe(src: str | bytes | Path) -> str:
    return f"'{src}'" if isinstance(src, (str, Path)) else f"<{len(src)} bytes>"


def read_image_bytes(src: str | bytes | Path) -> bytes:
    """The encoded bytes of an image given as a path or as bytes; clear errors for missing/empty files."""
    if isinstance(src, (bytes, bytearray)):
        data = bytes(src)
    else:
        path = Path(src)
        if not path.is_file():
            raise ImageError(f"image file {_describe(src)} does not exist")
        data = path.read_bytes()
    if not data:
        raise ImageError(f"image {_describe(src)} is empty (0 bytes)")
    return data


def image_sha256(src: str | bytes | Path) -> str:
    """Content hash of the encoded image bytes: the first part of every vision-cache key."""
    return hashlib.sha256(read_image_bytes(src)).hexdigest()


def _to_rgb(img: Image.Image) -> Image.Image:
    """Convert any PIL mode to RGB; transparency is composited on white (as the Qwen processor does)."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16/32-bit greyscale: scale to 8 bits instead of clipping everything above 255 to white.
        import numpy as np

        arr = np.asarray(img, dtype=np.float64)
        hi = arr.max() if arr.size and arr.max() > 0 else 1.0
        img = Image.fromarray((arr * (255.0 / hi)).round().astype("uint8"), mode="L")
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA"):
        background = Image.new("RGB", img.size, (255, 255, 255))
        background.paste(img.convert("RGBA"), mask=img.convert("RGBA").split()[-1])
        return background
    return img.convert("RGB")


def _decoded(src: str | bytes | Path) -> Image.Image:
    """The image opened and fully decoded (so truncation fails here), as stored: no orientation, any mode."""
    data = read_image_bytes(src)
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise ImageError(f"image {_describe(src)} cannot be decoded ({type(e).__name__}: {e})") from None
    return img


def load_image(src: str | bytes | Path) -> Image.Image:
    """Open, apply the EXIF orientation, convert to RGB and fully decode (so truncation fails here)."""
    return _to_rgb(ImageOps.exif_transpose(_decoded(src)))


def _oriented_size(img: Image.Image) -> tuple[int, int]:
    """(width, height) of an opened image after its EXIF orientation (a PNG's EXIF may follow its pixels: Pillow
    then decodes the file to find it)."""
    w, h = img.size
    orientation = img.getexif().get(0x0112, 1)
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


_SIZES: OrderedDict[tuple[str, int, int], tuple[int, int]] = OrderedDict()
"""`image_size`'s answers by image file (path, modification time, bytes): a row's image is sized when the trainer
checks the row and again for its prompt; a PNG costs a full decode each time (its EXIF may follow its pixels)."""
_SIZES_KEPT = 65536


def _file_key(src: str | bytes | Path) -> tuple[str, int, int] | None:
    if isinstance(src, (bytes, bytearray)):
        return None
    try:
        st = Path(src).stat()
    except OSError:
        return None  # read_image_bytes names the problem
    return str(src), st.st_mtime_ns, st.st_size


def _remember_size(key: tuple[str, int, int] | None, size: tuple[int, int]) -> None:
    if key is None:
        return
    _SIZES[key] = size
    if len(_SIZES) > _SIZES_KEPT:
        _SIZES.popitem(last=False)


def image_size(src: str | bytes | Path) -> tuple[int, int]:
    """(width, height) after EXIF orientation, reading only the header where possible; a file's answer is kept
    until the file changes (its modification time or size)."""
    key = _file_key(src)
    if key is not None and key in _SIZES:
        return _SIZES[key]
    data = read_image_bytes(src)
    try:
        size = _oriented_size(Image.open(io.BytesIO(data)))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:  # truncated headers raise OSError
        raise ImageError(f"image {_describe(src)} cannot be decoded ({type(e).__name__}: {e})") from None
    _remember_size(key, size)
    return size


@dataclass
class ImageInfo:
    problem: tuple[str, str] | None = None
    """(check, message) when the image cannot be used."""
    header: tuple[int, int] | None = None
    """(width, height) from the file header after EXIF orientation: what the prompt's pad count is built from."""
    decoded: tuple[int, int] | None = None
    """(width, height) of the fully decoded image: what the vision encoder sees."""


def inspect_image(src: str | bytes) -> ImageInfo:
    """Open one image completely (one decode); classify missing, empty, unreadable and corrupt files. What decides
    whether a row's image can be used, for `vlgrpo data doctor` and for the trainer when it draws the row."""
    if isinstance(src, str):
        path = Path(src)
        if not path.is_file():
            return ImageInfo(("image_missing", f"image file '{src}' does not exist"))
        if path.stat().st_size == 0:
            return ImageInfo(("image_empty", f"image file '{src}' is empty (0 bytes)"))
    elif not src:
        return ImageInfo(("image_empty", "inline image bytes are empty"))
    name = f"'{src}'" if isinstance(src, str) else f"<{len(src)} inline bytes>"
    try:
        img = _decoded(src)  # decoded once, in full: a truncated file fails here
        header = _oriented_size(img)
        decoded = ImageOps.exif_transpose(img).size
    except PermissionError as e:
        return ImageInfo(("image_unreadable", f"image {name} cannot be read ({e.strerror})"))
    except ImageError as e:
        return ImageInfo(("image_corrupt", str(e)))
    except Exception as e:  # noqa: BLE001 - a bare OSError from image_size on a truncated PNG's EXIF, Pillow's
        # DecompressionBombError, ...: the doctor reports every unusable image instead of stopping at the first
        return ImageInfo(("image_corrupt", f"image {name} cannot be decoded ({type(e).__name__}: {e})"))
    _remember_size(_file_key(src), header)  # the prompt's pad count asks next (`image_size`)
    return ImageInfo(None, header, decoded)


_QWEN2_5 = FAMILIES["qwen2_5_vl"]
RELEASED_MIN_PIXELS, RELEASED_MAX_PIXELS = _QWEN2_5.min_pixels, _QWEN2_5.max_pixels
"""Resize bounds of the released Qwen2-VL / Qwen2.5-VL processors (3,136 and 12,845,056 px, `vlgrpo.families`)."""


@dataclass(frozen=True)
class ProcessorGeometry:
    """The image-processor settings that decide resize and token count (second part of a cache key).

    The defaults are the released Qwen2.5-VL processors' (see DEFAULT_GEOMETRY)."""

    patch_size: int = _QWEN2_5.patch_size
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = RELEASED_MIN_PIXELS
    max_pixels: int = RELEASED_MAX_PIXELS

    @classmethod
    def from_processor(cls, processor) -> ProcessorGeometry:
        """Read the geometry from a Qwen2-VL/2.5-VL processor or its image processor."""
        ip = getattr(processor, "image_processor", processor)
        size = getattr(ip, "size", None) or {}
        min_pixels = getattr(ip, "min_pixels", None) or size.get("shortest_edge")
        max_pixels = getattr(ip, "max_pixels", None) or size.get("longest_edge")
        return cls(
            patch_size=int(ip.patch_size),
            merge_size=int(ip.merge_size),
            temporal_patch_size=int(getattr(ip, "temporal_patch_size", 2)),
            min_pixels=int(min_pixels),
            max_pixels=int(max_pixels),
        )

    def with_pixels(self, min_pixels: int | None = None, max_pixels: int | None = None) -> ProcessorGeometry:
        """This geometry with model.min_pixels / model.max_pixels applied where they are set (not None or 0)."""
        return replace(self, min_pixels=min_pixels or self.min_pixels, max_pixels=max_pixels or self.max_pixels)

    @property
    def factor(self) -> int:
        """Side of one language-model image token in pixels (patch x merge: 28 for Qwen2/2.5-VL)."""
        return self.patch_size * self.merge_size

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def resized_hw(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) the processor resizes an image to (Qwen's smart_resize)."""
        try:
            from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize  # 5 s import: on use

            return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        except ValueError as e:
            raise ImageError(f"image of {width}x{height} px cannot be resized for the model: {e}") from None

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """The `image_grid_thw` row of one still image: (1, resized_h / patch, resized_w / patch)."""
        rh, rw = self.resized_hw(height, width)
        return 1, rh // self.patch_size, rw // self.patch_size

    def num_image_tokens(self, height: int, width: int) -> int:
        """Language-model tokens of one image (<|image_pad|> count) after the 2x2 merge."""
        _, gh, gw = self.grid_thw(height, width)
        return gh * gw // (self.merge_size**2)


def released_geometry(arch: str) -> ProcessorGeometry:
    """The geometry of a family's released processors (its patch size and pixel bounds in `vlgrpo.families`)."""
    f = FAMILIES[arch]
    return ProcessorGeometry(patch_size=f.patch_size, min_pixels=f.min_pixels, max_pixels=f.max_pixels)


DEFAULT_GEOMETRY = ProcessorGeometry()
"""The geometry every layer assumes when no processor, checkpoint or config says otherwise: rewards (qwen2_5 boxes),
`vlgrpo data doctor`, `vlgrpo reward`, the memory planner and the exported prompt contract."""
QWEN3_VL_GEOMETRY = released_geometry("qwen3_vl")
"""The released Qwen3-VL processors' geometry (patch_size 16, 65,536 .. 16,777,216 px): one token per 32 x 32 px."""


def checkpoint_geometry(
    name_or_path: str, min_pixels: int | None = None, max_pixels: int | None = None, arch: str | None = None
) -> tuple[ProcessorGeometry, str]:
    """The resize geometry a run will use, without loading anything heavy: the checkpoint directory's
    preprocessor_config.json / processor_config.json when local, else the released processors' of `arch` (the 16 px
    families qwen3_vl and qwen3_5 differ from DEFAULT_GEOMETRY), DEFAULT_GEOMETRY without one; then the
    model.min_pixels / max_pixels overrides. Returns (geometry, where it came from)."""
    geometry, source = DEFAULT_GEOMETRY, "released Qwen processor defaults"
    if arch in FAMILIES and released_geometry(arch) != DEFAULT_GEOMETRY:  # Qwen3-VL, Qwen3.5
        geometry = released_geometry(arch)
        source = f"released {arch} processor defaults ({FAMILIES[arch].processor_class}'s)"
    for name in ("preprocessor_config.json", "processor_config.json"):
        path = Path(name_or_path) / name
        if path.is_file():
            ip = json.loads(path.read_text())
            ip = ip.get("image_processor", ip)
            size = ip.get("size") or {}
            geometry = ProcessorGeometry(
                patch_size=int(ip.get("patch_size", 14)),
                merge_size=int(ip.get("merge_size", 2)),
                temporal_patch_size=int(ip.get("temporal_patch_size", 2)),
                min_pixels=int(ip.get("min_pixels") or size.get("shortest_edge") or RELEASED_MIN_PIXELS),
                max_pixels=int(ip.get("max_pixels") or size.get("longest_edge") or RELEASED_MAX_PIXELS),
            )
            source = str(path)
            break
    overrides = [key for key, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v]
    if overrides:
        geometry = geometry.with_pixels(min_pixels, max_pixels)
        source += " + model." + " / model.".join(overrides)
    return geometry, source


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def image_files(folder: str | Path) -> list[Path]:
    """The image files under a folder (recursive, sorted); a clear error when there are none."""
    found = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not found:
        raise InputError(f"{folder}: no image files ({', '.join(IMAGE_SUFFIXES)}) in it")
    return found
