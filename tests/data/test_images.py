import hashlib
import io

import pytest
from PIL import Image

from vlgrpo.data.images import ImageError, ProcessorGeometry, image_sha256, image_size, load_image


def _png(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (40, 20), (255, 0, 0))
    img.paste((0, 0, 255), (0, 0, 10, 20))  # blue stripe on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW when displayed
    data = _png(img, "JPEG", exif=exif.tobytes(), quality=95)
    loaded = load_image(data)
    assert loaded.size == (20, 40)
    assert image_size(data) == (20, 40)
    r, g, b = loaded.getpixel((10, 2))  # the left stripe is now on top
    assert b > 200 and r < 60


@pytest.mark.parametrize(
    "mode, make, expected",
    [
        ("RGBA", lambda: Image.new("RGBA", (4, 4), (255, 0, 0, 0)), (255, 255, 255)),  # transparent -> white
        ("LA", lambda: Image.new("LA", (4, 4), (0, 255)), (0, 0, 0)),
        ("P", lambda: Image.new("RGB", (4, 4), (0, 128, 0)).convert("P", palette=Image.Palette.ADAPTIVE), (0, 128, 0)),
        ("CMYK", lambda: Image.new("CMYK", (4, 4), (0, 255, 255, 0)), (255, 0, 0)),
        ("I;16", lambda: Image.new("I;16", (4, 4), 1000), (255, 255, 255)),  # max value scales to white
    ],
)
def test_every_mode_becomes_rgb(mode, make, expected):
    img = make()
    fmt = "TIFF" if mode in ("CMYK", "I;16") else "PNG"
    loaded = load_image(_png(img, fmt))
    assert loaded.mode == "RGB"
    assert loaded.getpixel((1, 1)) == expected


def test_sixteen_bit_keeps_contrast():
    img = Image.new("I;16", (2, 1))
    img.putpixel((0, 0), 500)
    img.putpixel((1, 0), 1000)
    loaded = load_image(_png(img, "TIFF"))
    assert loaded.getpixel((0, 0)) == (128, 128, 128)  # 500/1000*255 rounded, not clipped to 255
    assert loaded.getpixel((1, 0)) == (255, 255, 255)


def test_bad_images_fail_with_their_name(tmp_path):
    missing = tmp_path / "missing.png"
    with pytest.raises(ImageError, match="missing.png' does not exist"):
        load_image(str(missing))
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(ImageError, match="empty.png' is empty"):
        load_image(str(empty))
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"this is not an image at all")
    with pytest.raises(ImageError, match="corrupt.png' cannot be decoded"):
        load_image(str(corrupt))
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(_png(Image.effect_noise((64, 64), 50))[:200])
    with pytest.raises(ImageError, match="truncated.png' cannot be decoded"):
        load_image(str(truncated))


def test_hash_is_sha256_of_file_bytes(tmp_path):
    data = _png(Image.new("RGB", (8, 8), (1, 2, 3)))
    path = tmp_path / "a.png"
    path.write_bytes(data)
    assert image_sha256(str(path)) == image_sha256(data) == hashlib.sha256(data).hexdigest()


def test_geometry_matches_the_processor(tiny_model_dir):
    from vlgrpo.models import load_processor

    processor = load_processor(tiny_model_dir("qwen2_5_vl"), max_pixels=1003520)
    geo = ProcessorGeometry.from_processor(processor)
    assert (geo.patch_size, geo.merge_size, geo.factor) == (14, 2, 28)
    img = Image.new("RGB", (1000, 600), (10, 20, 30))
    out = processor.image_processor(images=[img], return_tensors="pt")
    t, gh, gw = out["image_grid_thw"][0].tolist()
    assert geo.grid_thw(600, 1000) == (t, gh, gw)
    # smart_resize by hand: round(600/28)*28 = 588, round(1000/28)*28 = 1008; area under max_pixels.
    assert geo.resized_hw(600, 1000) == (588, 1008)
    assert geo.num_image_tokens(600, 1000) == (588 // 28) * (1008 // 28) == 756
    assert geo.fingerprint() != ProcessorGeometry(max_pixels=50176).fingerprint()


def test_a_files_size_is_read_once_until_the_file_changes(tmp_path, monkeypatch):
    """`inspect_image` decodes once and leaves the size for `image_size` (the prompt's pad count asks next); a file
    rewritten with another size is read again."""
    import os

    import vlgrpo.data.images as images

    path = tmp_path / "a.png"
    path.write_bytes(_png(Image.new("RGB", (30, 20))))
    opened = []
    real_open = Image.open
    monkeypatch.setattr(images.Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    info = images.inspect_image(str(path))
    assert (info.header, info.decoded, len(opened)) == ((30, 20), (30, 20), 1)
    assert image_size(str(path)) == (30, 20) and image_size(path) == (30, 20) and len(opened) == 1
    path.write_bytes(_png(Image.new("RGB", (12, 50))))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a later modification time, whatever the clock
    assert image_size(str(path)) == (12, 50) and len(opened) == 2
