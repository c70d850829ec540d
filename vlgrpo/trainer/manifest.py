"""Checkpoint manifests: every file of a checkpoint with its size and sha256, written last, checked before any load;
and the scan that refuses a torch file whose pickle names anything beyond tensors and allowed classes.

Works on directories only; knows nothing of what the files hold or of ranks (callers run it on rank 0).
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from vlgrpo.trainer.safe_state import CheckpointError

MANIFEST = "manifest.json"
FORMAT = 1
CHUNK = 16 * 1024**2


def _files(directory: Path) -> list[str]:
    """Relative posix paths of every regular file under `directory`, the manifest itself excepted, sorted."""
    found = [p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()]
    return sorted(f for f in found if f != MANIFEST)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)  # hashlib releases the GIL on large blocks: the threads below hash in parallel
    return h.hexdigest()


def _hash_all(directory: Path, names: list[str]) -> dict[str, str]:
    workers = max(1, min(8, os.cpu_count() or 1, len(names)))
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(names, pool.map(lambda n: _sha256(directory / n), names)))


def write_manifest(directory: Path, step: int) -> None:
    """Record every file of a fully written checkpoint directory (sizes and sha256), as its last file."""
    names = _files(directory)
    digests = _hash_all(directory, names)
    files = {n: {"bytes": (directory / n).stat().st_size, "sha256": digests[n]} for n in names}
    (directory / MANIFEST).write_text(json.dumps({"format": FORMAT, "step": step, "files": files}, indent=1))


def check_manifest(directory: Path) -> str | None:
    """Why `directory` is not a complete, unaltered checkpoint (None when it is): the manifest is missing or
    unreadable, a file is missing, has another size or checksum, or a file is there that the manifest does not list."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(files, dict):
            return f"{MANIFEST} has an unknown format {manifest.get('format')!r}"
    except FileNotFoundError:
        return f"it has no {MANIFEST} (it was interrupted before its last write, or written by an older vlgrpo)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its {MANIFEST} is unreadable: {e}"
    present = _files(directory)
    extra = sorted(set(present) - set(files))
    if extra:
        return f"it holds {extra[0]}, which its {MANIFEST} does not list"
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != entry["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, its {MANIFEST} says {entry['bytes']} (truncated?)"
    digests = _hash_all(directory, list(files))
    bad = [n for n in files if digests[n] != files[n]["sha256"]]
    if bad:
        return f"{bad[0]} does not match its checksum in {MANIFEST}"
    return None


def refuse_pickled_code(directory: Path, allowed: set[str]) -> None:
    """Raise CheckpointError if a torch file (`*.pt`) of the checkpoint names, in its pickle, any global beyond
    tensors, plain containers and `allowed` (e.g. DeepSpeed's loss scaler): loading it would construct or call it.
    Reads only the pickle opcodes (nothing is constructed), so it is cheap on large files."""
    for name in _files(directory):
        if not name.endswith(".pt"):
            continue
        path = directory / name
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        except Exception as e:  # noqa: BLE001 - whatever the parser raises, the file is not a torch checkpoint
            raise CheckpointError(f"checkpoint file '{path}' was refused: not a torch zip checkpoint ({e})") from None
        unsafe = sorted(set(names) - allowed)
        if unsafe:
            raise CheckpointError(
                f"checkpoint file '{path}' was refused: loading it would unpickle {', '.join(unsafe[:3])}, which a "
                "vlgrpo checkpoint never holds (it loads tensors, plain containers and DeepSpeed's loss-scaler "
                "records only). The file was altered or not written by vlgrpo: never load it with weights_only off"
            )
