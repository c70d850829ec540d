"""Vision-encoder features keyed by (image sha256, vision-weights version, processor fingerprint), so every image is
encoded once per weights version: an in-memory LRU with a byte budget in front of an optional on-disk store. A disk
entry carries its own key and checksum (a file copied over another key is never served); a disk write that fails
(full, read-only) is skipped and counted, and the run goes on.

An entry holds what the language model takes from one image or one video: the merged embeddings and, for Qwen3-VL,
every DeepStack feature map. A video's key is the content hash of the frames the model sees (decoded, resized) with
the settings that took them (`data.video.VideoClip.sha256`). The fingerprints of the tower and the processor are in
`key.py`. Knows the model only through its vision tower (`visual`, mergers included); knows nothing of prompts or
rollout.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import uuid
from collections import OrderedDict
from pathlib import Path

import torch
from torch import Tensor

from vlgrpo.data.images import ProcessorGeometry, image_sha256, load_image
from vlgrpo.data.video import VideoClip
from vlgrpo.vision_cache.entry import (  # noqa: F401 - the package's API: entries and `vlgrpo cache stats | clear`
    FORMAT_VERSION,
    SUFFIX,
    TMP_PREFIX,
    CacheDirError,
    ImageFeatures,
    checksum,
    clear_disk,
    disk_stats,
    entry_format,
    read_entry,
)
from vlgrpo.vision_cache.key import find_visual, processor_fingerprint, vision_fingerprint  # noqa: F401

STAT_KEYS = (
    "hits",
    "misses",
    "encoder_calls",
    "images_encoded",
    "videos_encoded",
    "bytes",
    "disk_hits",
    "corrupt",
    "other_format",
    "write_errors",
    "adopted",
)


# ---------------------------------------------------------------- the cache


class VisionCache:
    """Encode each unique image once per vision-weights version; serve every later pass from memory or disk.

    Frozen tower: the version is the weights fingerprint, so entries stay valid across steps, epochs and runs (the
    disk store makes them survive restarts). Trainable tower (or merger): the version also carries the optimiser step
    (`set_step`), entries of older steps are dropped, nothing is written to disk, and the update pass recomputes
    features with autograd through `encode_with_grad`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        processor,
        max_bytes: int = 2**31,
        disk_dir: str | Path | None = None,
        trainable: bool = False,
        fingerprint: str | None = None,
        store_device: str | None = "cpu",
    ):
        self.model = model
        self.processor = processor
        self.max_bytes = int(max_bytes)
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self.trainable = trainable
        self.store_device = store_device
        self.weights_fp = fingerprint or vision_fingerprint(model)
        self.processor_fp = processor_fingerprint(processor)
        self.video_fp = processor_fingerprint(getattr(processor, "video_processor", None) or processor)
        self.geometry = ProcessorGeometry.from_processor(processor)
        self.merge = self.geometry.merge_size
        self.step = 0
        self._lru: OrderedDict[str, ImageFeatures] = OrderedDict()
        self._bytes = 0
        self._write_warned = False
        self.reset_stats()

    # -- versioning

    @property
    def version(self) -> str:
        """Vision-weights version: the fingerprint, plus the optimiser step when the tower is trainable."""
        return f"{self.weights_fp}@{self.step}" if self.trainable else self.weights_fp

    def set_step(self, step: int) -> None:
        """New optimiser step. Trainable tower: older entries can never be hit again, so they are dropped."""
        if self.trainable and step != self.step:
            self.step = int(step)
            self._lru.clear()
            self._bytes = 0

    def key(self, sha: str) -> str:
        return hashlib.sha256(f"{sha}|{self.version}|{self.processor_fp}".encode()).hexdigest()

    def source_sha(self, source) -> str:
        """An image's content hash; a video's frames-and-settings hash (prefixed, so it never names an image)."""
        if isinstance(source, VideoClip):
            return "video:" + hashlib.sha256(f"{source.sha256(self.geometry)}|{self.video_fp}".encode()).hexdigest()
        return image_sha256(source)

    # -- lookups

    def get_rows(self, rows: list[list]) -> list[list[ImageFeatures]]:
        """`get` over every row's sources at once (one encoder call for the images of all rows, one for the videos),
        regrouped per row."""
        return _regroup(self.get([s for row in rows for s in row]), rows)

    def get(self, images: list) -> list[ImageFeatures]:
        """Features for each source (an image, or a VideoClip), aligned with `images`; the unique uncached images are
        encoded in one batch, the unique uncached videos in another."""
        shas = [self.source_sha(img) for img in images]
        keys = [self.key(s) for s in shas]
        found: dict[str, ImageFeatures] = {}
        missing: dict[str, tuple[str, str | bytes]] = {}  # key -> (sha, image), first occurrence
        for k, sha, img in zip(keys, shas, images):
            if k in found or k in missing:
                continue
            feats = self._memory_get(k) or self._disk_get(k)
            if feats is None:
                missing[k] = (sha, img)
            else:
                found[k] = feats
        self._stats["hits"] += len(found)
        self._stats["misses"] += len(missing)
        if missing:
            with torch.no_grad():
                encoded = self._encode([img for _, img in missing.values()])
            for (k, (sha, _)), feats in zip(missing.items(), encoded):
                feats = feats.stored(self.store_device)
                found[k] = feats
                self._memory_put(k, feats)
                self._disk_put(k, sha, feats)
        return [found[k] for k in keys]

    def handover(self, images: list[str | bytes]) -> tuple[str, dict[str, tuple[str, ImageFeatures]]] | None:
        """A frozen tower's features of `images` that this cache holds in memory, for another process's cache of the
        same weights (a split rollout's worker hands its trainer what it encoded): (version and processor
        fingerprint, {key: (image sha256, features)}). None for a trainable tower, whose features are of one step."""
        if self.trainable:
            return None
        entries = {}
        for img in images:
            sha = self.source_sha(img)
            k = self.key(sha)
            if k not in entries and k in self._lru:
                entries[k] = (sha, self._lru[k])
        return f"{self.version}|{self.processor_fp}", entries

    def adopt(self, handed: tuple[str, dict[str, tuple[str, ImageFeatures]]] | None) -> int:
        """Take the entries of another cache's `handover` (memory and disk, as if encoded here) when they are of this
        cache's weights and processor; returns how many were new (`adopted`). Entries of other weights are ignored:
        their keys could never be hit here."""
        if handed is None or self.trainable or handed[0] != f"{self.version}|{self.processor_fp}":
            return 0
        new = 0
        for k, (sha, feats) in handed[1].items():
            if k in self._lru:
                continue
            feats = feats.stored(self.store_device)
            self._memory_put(k, feats)
            if self.disk_dir is not None and not self._path(k).is_file():
                self._disk_put(k, sha, feats)
            new += 1
        self._stats["adopted"] += new
        return new

    def encode_rows_with_grad(self, rows: list[list]) -> list[list[ImageFeatures]]:
        """`encode_with_grad` over every row's sources at once, regrouped per row."""
        return _regroup(self.encode_with_grad([s for row in rows for s in row]), rows)

    def encode_with_grad(self, images: list) -> list[ImageFeatures]:
        """Recompute features with autograd (trainable tower, update pass); nothing is cached. Duplicates share one.
        Images and videos go through ONE tower call: under ZeRO-3 each call gathers the tower's shards, so a rank
        whose micro-batch holds a video beside images would otherwise gather twice where the others gather once,
        and the ranks' collectives would no longer pair up (a hang)."""
        shas = [self.source_sha(img) for img in images]
        unique = list(dict.fromkeys(shas))
        first = {s: img for s, img in zip(reversed(shas), reversed(images))}
        encoded = dict(zip(unique, self._encode([first[s] for s in unique], one_call=True)))
        return [encoded[s] for s in shas]

    def _encode(self, sources: list, one_call: bool = False) -> list[ImageFeatures]:
        """One vision-encoder call over the images among `sources` and one over the videos (aligned with `sources`);
        `one_call`: a single call over both (the tower encodes each item on its own: its patches attend within the
        item, `grid_thw` says where each ends), when their patches have the same width (Qwen's: both temporal)."""
        videos = [i for i, s in enumerate(sources) if isinstance(s, VideoClip)]
        images = [i for i, s in enumerate(sources) if not isinstance(s, VideoClip)]
        parts = []  # (indices, pixels, grid) per modality
        if images:
            pix = self.processor.image_processor(images=[load_image(sources[i]) for i in images], return_tensors="pt")
            parts.append((images, pix["pixel_values"], pix["image_grid_thw"]))
            self._stats["images_encoded"] += len(images)
        if videos:
            frames = [sources[i].resized_frames(self.geometry) for i in videos]
            # frames arrive at the model's size: the processor only normalises and patchifies them (transformers
            # >= 5.20 warns about a per-frame pixel cap unless told; nothing is resized here, so there is none)
            vp = self.processor.video_processor
            cap = {"cap_pixels_per_frame": False} if hasattr(type(vp), "cap_pixels_per_frame") else {}
            pix = vp(videos=frames, do_resize=False, do_sample_frames=False, return_tensors="pt", **cap)
            parts.append((videos, pix["pixel_values_videos"], pix["video_grid_thw"]))
            self._stats["videos_encoded"] += len(videos)
        if one_call and len(parts) == 2 and parts[0][1].shape[-1] == parts[1][1].shape[-1]:
            parts = [(images + videos, torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts]))]
        out: list = [None] * len(sources)
        for indices, pixels, grid in parts:
            for i, f in zip(indices, self._tower(pixels, grid)):
                out[i] = f
        for i in videos:
            out[i].video_fps = sources[i].info().sample_fps
        return out

    def _tower(self, pixels: Tensor, grid: Tensor) -> list[ImageFeatures]:
        """One vision-encoder call: pixels through `visual` (mergers included) -> [N_i, H] each, with [L, N_i, H]
        DeepStack maps when the tower has them (Qwen3-VL)."""
        visual = find_visual(self.model)
        param = next(visual.parameters())
        pixels, grid = pixels.to(param.device, param.dtype), grid.to(param.device)
        encoded = visual(pixels, grid_thw=grid)
        merged = encoded.pooler_output if hasattr(encoded, "pooler_output") else encoded  # [sum N_i, H]
        sizes = (grid.prod(-1) // self.merge**2).tolist()
        maps = getattr(encoded, "deepstack_features", None)  # L x [sum N_i, H]; None without DeepStack
        stacks = [None] * len(sizes)
        if maps is not None:
            stacks = torch.stack(maps) if maps else merged.new_zeros((0, *merged.shape))  # [L, sum N_i, H]
            stacks = torch.split(stacks, sizes, dim=1)
        self._stats["encoder_calls"] += 1
        return [ImageFeatures(e, g.cpu().long(), d) for e, g, d in zip(torch.split(merged, sizes), grid, stacks)]

    # -- memory LRU

    def _memory_get(self, k: str) -> ImageFeatures | None:
        feats = self._lru.get(k)
        if feats is not None:
            self._lru.move_to_end(k)
        return feats

    def _memory_put(self, k: str, feats: ImageFeatures) -> None:
        if feats.nbytes > self.max_bytes or k in self._lru:
            return
        self._lru[k] = feats
        self._bytes += feats.nbytes
        while self._bytes > self.max_bytes:
            _, old = self._lru.popitem(last=False)
            self._bytes -= old.nbytes

    # -- disk store

    def _path(self, k: str) -> Path:
        return self.disk_dir / k[:2] / f"{k}{SUFFIX}"

    def _disk_get(self, k: str) -> ImageFeatures | None:
        if self.disk_dir is None or self.trainable:
            return None
        path = self._path(k)
        if not path.is_file():
            return None
        if entry_format(path) not in (FORMAT_VERSION, None):  # another vlgrpo's layout: a miss, rewritten in ours
            self._stats["other_format"] += 1
            path.unlink(missing_ok=True)
            return None
        feats = read_entry(path, self.merge, key=k)
        if feats is None:  # corrupt, truncated or another key's entry: count it, delete it, recompute
            self._stats["corrupt"] += 1
            path.unlink(missing_ok=True)
            return None
        self._stats["disk_hits"] += 1
        feats = feats.stored(self.store_device)
        self._memory_put(k, feats)
        return feats

    def _disk_put(self, k: str, sha: str, feats: ImageFeatures) -> None:
        """Write one entry atomically. A failed write (disk full, read-only) is skipped and counted in
        `write_errors`, reported once per cache; the features stay in memory and the run goes on."""
        if self.disk_dir is None or self.trainable:
            return
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        path = self._path(k)
        tensors = {"embeds": feats.embeds, "grid_thw": feats.grid_thw}
        if feats.deepstack is not None:
            tensors["deepstack"] = feats.deepstack
        tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
        meta = {
            "format": FORMAT_VERSION,
            "key": k,
            "image_sha256": sha,
            "vision": self.version,
            "processor": self.processor_fp,
            "sha256": checksum(*tensors.values()),
        }
        if feats.video_fps is not None:
            meta["video_fps"] = repr(float(feats.video_fps))
        tmp = path.parent / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(tmp), metadata=meta)
            os.replace(tmp, path)  # atomic: readers see the old state or the whole new file, never half of it
        except (OSError, SafetensorError) as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if not self._write_warned:
                print(
                    f"[vlgrpo] warning: vision cache entry '{path}' not written ({e}); entries that cannot be "
                    "written are skipped and counted in vision/write_errors",
                    file=sys.stderr,
                )
                self._write_warned = True
            self._stats["write_errors"] += 1

    # -- counters

    def stats(self) -> dict[str, int]:
        """Counters since the last reset (`bytes` is the current in-memory size); logged as `vision/<key>`."""
        return {**self._stats, "bytes": self._bytes}

    def reset_stats(self) -> None:
        self._stats = {k: 0 for k in STAT_KEYS if k != "bytes"}


def _regroup(flat: list, rows: list[list]) -> list[list]:
    """`flat` (aligned with the concatenated rows) cut back into rows."""
    out, at = [], 0
    for row in rows:
        out.append(flat[at : at + len(row)])
        at += len(row)
    return out
