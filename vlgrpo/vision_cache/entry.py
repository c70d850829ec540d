"""One vision-cache entry and the on-disk store: `ImageFeatures` (what the language model takes from one image or
video), the checksummed safetensors file an entry is written as, and the maintenance of `vlgrpo cache stats | clear`.
Knows nothing of models or of the cache's keys.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from vlgrpo.types import InputError

FORMAT_VERSION = "3"  # 2: entries carry their key; 3: and their DeepStack maps (Qwen3-VL), a video its frame rate
SUFFIX = ".safetensors"
TMP_PREFIX = ".tmp-"


@dataclass
class ImageFeatures:
    """The language-model inputs of one image or one video: merged vision embeddings, the grid they came from and,
    for a tower with DeepStack (Qwen3-VL), its feature maps."""

    embeds: Tensor
    """[N, H]: N image (or video) tokens after the 2x2 merge, H = language-model hidden size."""
    grid_thw: Tensor
    """[3] long: (t, h, w) in patches, the `image_grid_thw` (or `video_grid_thw`) row."""
    deepstack: Tensor | None = None
    """[L, N, H]: map i is added to the hidden states of language-model layer i at the visual tokens (Qwen3-VL's
    `deepstack_visual_indexes`, L of them); None for a tower without DeepStack (Qwen2-VL, Qwen2.5-VL)."""
    video_fps: float | None = None
    """None for an image; for a video, the rate its taken frames represent (Qwen2.5-VL's `second_per_grid_ts` is
    temporal_patch_size / video_fps)."""

    @property
    def is_video(self) -> bool:
        return self.video_fps is not None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.embeds, self.grid_thw, self.deepstack) if t is not None)

    def stored(self, device: str | None) -> ImageFeatures:
        """Detached, on `device` (None: where they are): the copy the cache holds. The grid stays on the CPU."""
        move = lambda t: t if t is None else t.detach().to(device or t.device)  # noqa: E731
        return ImageFeatures(move(self.embeds), self.grid_thw, move(self.deepstack), self.video_fps)


def checksum(embeds: Tensor, grid: Tensor, deepstack: Tensor | None = None) -> str:
    h = hashlib.sha256()
    for t in (embeds, grid) if deepstack is None else (embeds, grid, deepstack):
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def entry_format(path: Path) -> str | None:
    """The format version a disk entry was written in (its header only; None when unreadable)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("format")
    except Exception:  # noqa: BLE001 - an unreadable file: read_entry counts it as corrupt
        return None


def read_entry(path: Path, merge_size: int = 2, key: str | None = None) -> ImageFeatures | None:
    """Load one disk entry and verify its checksum (DeepStack maps included), shapes and (given `key`) the key it was
    written under; None if it is corrupt, truncated, foreign, another key's entry copied here or short of its maps."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            embeds, grid = f.get_tensor("embeds"), f.get_tensor("grid_thw")
            deepstack = f.get_tensor("deepstack") if "deepstack" in f.keys() else None
    except Exception:  # noqa: BLE001 - any unreadable file is a corrupt entry, whatever safetensors raises
        return None
    if meta.get("sha256") != checksum(embeds, grid, deepstack) or grid.shape != (3,) or embeds.dim() != 2:
        return None
    if key is not None and meta.get("key") != key:
        return None
    if embeds.shape[0] != int(grid.prod()) // merge_size**2:
        return None
    if deepstack is not None and (deepstack.dim() != 3 or deepstack.shape[1:] != embeds.shape):
        return None
    if meta.get("image_sha256", "").startswith("video:") != ("video_fps" in meta):
        return None
    return ImageFeatures(embeds, grid.long(), deepstack, float(meta["video_fps"]) if "video_fps" in meta else None)


# ---------------------------------------------------------------- `vlgrpo cache stats | clear`


class CacheDirError(InputError):
    """A vision-cache directory that does not exist. Transient: on a network file system it can vanish for a while
    (an unmounted share); a restart looks again."""

    transient = True


def _root(disk_dir: str | Path) -> Path:
    root = Path(disk_dir)
    if not root.is_dir():
        raise CacheDirError(f"vision cache directory '{root}' does not exist (rollout.vision_cache_dir)")
    return root


def _entries(disk_dir: Path):
    return sorted(p for p in disk_dir.glob(f"*/*{SUFFIX}") if not p.name.startswith(TMP_PREFIX))


def disk_stats(disk_dir: str | Path) -> dict:
    """Entries, bytes and a per-vision-version count of an on-disk cache (headers only; tensors are not loaded)."""
    from safetensors import safe_open

    root = _root(disk_dir)
    entries, total, versions, unreadable = 0, 0, {}, 0
    for p in _entries(root):
        entries += 1
        total += p.stat().st_size
        try:
            with safe_open(str(p), framework="pt") as f:
                v = (f.metadata() or {}).get("vision", "?")
        except Exception:  # noqa: BLE001
            unreadable += 1
            continue
        versions[v] = versions.get(v, 0) + 1
    tmp = len(list(root.glob(f"*/{TMP_PREFIX}*")))
    return {
        "dir": str(root),
        "entries": entries,
        "bytes": total,
        "by_vision_version": versions,
        "unreadable": unreadable,
        "partial_writes": tmp,
    }


def clear_disk(disk_dir: str | Path) -> dict:
    """Delete every cache entry (and leftover partial writes) under `disk_dir`; other files are left alone."""
    root = _root(disk_dir)
    removed, freed = 0, 0
    for p in [*_entries(root), *root.glob(f"*/{TMP_PREFIX}*")]:
        freed += p.stat().st_size
        p.unlink()
        removed += 1
    for sub in root.iterdir():
        if sub.is_dir() and len(sub.name) == 2 and not any(sub.iterdir()):
            sub.rmdir()
    return {"dir": str(root), "removed": removed, "bytes_freed": freed}
