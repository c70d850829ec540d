"""Checkpoint manifests: every file of a checkpoint with its size and sha256, written last, checked before any load;
and the scan that refuses a torch file whose pickle names anything beyond tensors and allowed classes.

Works on directories only; knows nothing of what the files hold. On several ranks every rank hashes its share of the
files (a 7B ZeRO-3 checkpoint holds ~100 GB: one rank alone took minutes while the others waited) and the caller's
`gather` brings the shares together; alone, a process hashes everything.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from vlgrpo import heartbeat
from vlgrpo.trainer.safe_state import CheckpointError

MANIFEST = "manifest.json"
FORMAT = 1
CHUNK = 16 * 1024**2

Share = tuple[int, int]
"""(this rank, ranks): the rank hashes files rank, rank + ranks, ... of the sorted list."""
Gather = Callable[[object], list]
"""Every rank's object, in rank order (a collective: every rank calls it once per manifest written or checked)."""


def _alone(obj: object) -> list:
    return [obj]


def _hash_share(directory: Path, names: list[str], share: Share, gather: Gather) -> dict[str, str]:
    """sha256 of every file in `names`, each hashed by one rank. A rank that cannot read its files still joins the
    gather (the others would wait for it), then raises."""
    rank, ranks = share
    try:
        mine: dict | str = _hash_all(directory, names[rank::ranks])
    except OSError as e:
        mine = f"rank {rank}: {e}"
    parts = gather(mine)
    for part in parts:
        if isinstance(part, str):
            raise OSError(f"could not checksum the files of {directory}: {part}")
    return {name: digest for part in parts for name, digest in part.items()}


def _files(directory: Path) -> list[str]:
    """Relative posix paths of every regular file under `directory`, the manifest itself excepted, sorted."""
    found = [p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()]
    return sorted(f for f in found if f != MANIFEST)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)  # hashlib releases the GIL on large blocks: the threads below hash in parallel
            heartbeat.beat(f"checksum of {path.parent.name}/{path.name}")
    return h.hexdigest()


def _hash_all(directory: Path, names: list[str]) -> dict[str, str]:
    workers = max(1, min(8, os.cpu_count() or 1, len(names)))
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(names, pool.map(lambda n: _sha256(directory / n), names)))


def write_manifest(directory: Path, step: int, share: Share = (0, 1), gather: Gather = _alone) -> None:
    """Record every file of a fully written checkpoint directory (sizes and sha256), as its last file: the rank of
    share 0 lists the files, every rank hashes its share of that list, the rank of share 0 writes the manifest. One
    listing decides: on a network file system the nodes' listings can differ for a while (a file another node just
    wrote), and shares cut from different lists left a file unhashed (a KeyError on rank 0, not reported as the
    checkpoint error it is); a file of the list a rank cannot open is an OSError, a failed write, on every rank."""
    names = gather(_files(directory) if share[0] == 0 else None)[0]
    digests = _hash_share(directory, names, share, gather)
    if share[0] == 0:
        files = {n: {"bytes": (directory / n).stat().st_size, "sha256": digests[n]} for n in names}
        (directory / MANIFEST).write_text(json.dumps({"format": FORMAT, "step": step, "files": files}, indent=1))


def check_manifest(directory: Path, share: Share = (0, 1), gather: Gather = _alone) -> str | None:
    """Why `directory` is not a complete, unaltered checkpoint (None when it is): the manifest is missing or
    unreadable, a file is missing, has another size or checksum, or a file is there that the manifest does not list.
    Every rank checks the layout and hashes its share of the files; all ranks return the same answer."""
    why, files = _layout_problem(directory)
    names = sorted(files) if why is None else []
    rank, ranks = share
    mine = names[rank::ranks]
    try:
        digests = _hash_all(directory, mine)
        bad = [n for n in mine if digests[n] != files[n]["sha256"]]
    except OSError as e:
        why, bad = why or f"it could not be read: {e}", []
    parts = gather((why, bad))
    whys = [w for w, _ in parts if w]
    if whys:
        return whys[0]
    bad = sorted(n for _, part in parts for n in part)
    return f"{bad[0]} does not match its checksum in {MANIFEST}" if bad else None


def _layout_problem(directory: Path) -> tuple[str | None, dict]:
    """(why the manifest or the files it lists are not there as listed, or None; the manifest's files)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(files, dict):
            return f"{MANIFEST} has an unknown format {manifest.get('format')!r}", {}
    except FileNotFoundError:
        return f"it has no {MANIFEST} (it was interrupted before its last write, or written by an older vlgrpo)", {}
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its {MANIFEST} is unreadable: {e}", {}
    present = _files(directory)
    extra = sorted(set(present) - set(files))
    if extra:
        return f"it holds {extra[0]}, which its {MANIFEST} does not list", {}
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing", {}
        if path.stat().st_size != entry["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, its {MANIFEST} says {entry['bytes']} (truncated?)", {}
    return None, files


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
