"""Checkpoints: everything needed to continue a run bit-for-bit (weights or adapter, optimiser, schedule, RNG
states, data position, step, non-finite counters, resolved config), written atomically with a manifest of sizes and
checksums as its last file; resume from the newest checkpoint that verifies; HF export.

A run killed at any moment resumes from its newest complete checkpoint; metrics logged after it are dropped. Nothing
in a run directory is unpickled beyond tensors and plain containers (safe_state.py, manifest.py).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from vlgrpo.config import Config, to_dict
from vlgrpo.trainer.backends import Backend
from vlgrpo.trainer.manifest import check_manifest, refuse_pickled_code, write_manifest
from vlgrpo.trainer.metrics import truncate_metrics
from vlgrpo.trainer.ranks import from_rank0, gather_from_ranks, max_over_ranks, rank_world
from vlgrpo.trainer.rundir import RunDirError, describe, is_write_error
from vlgrpo.trainer.safe_state import CheckpointError, load_json, rng_state, set_rng_state, write_json

if TYPE_CHECKING:  # the types of a run's parts (none of these modules imports this one)
    from vlgrpo.data.stream import SampleStream
    from vlgrpo.rollout.base import RolloutEngine
    from vlgrpo.rollout.split import SplitRollout
    from vlgrpo.rollout.weight_stream import SyncStats
    from vlgrpo.trainer.rows import CheckedRows
    from vlgrpo.vision_cache import VisionCache

KEEP = 2
"""Complete checkpoints kept per run (older ones are deleted after a new one is written)."""
REJECTED = "rejected-"
"""Prefix a checkpoint that failed verification is renamed with (kept for inspection, never loaded)."""


class Checkpointed(Protocol):
    """The parts of a run a checkpoint saves and restores (`trainer.state.RunState` has them): described here so
    that this module needs nothing of the module that builds a run, which calls it."""

    cfg: Config
    run_dir: Path
    backend: Backend
    cache: VisionCache
    engine: RolloutEngine | SplitRollout | None
    engine_needs_weights: bool
    data: SampleStream
    rows: CheckedRows
    step: int
    nonfinite_steps: int
    nonfinite_streak: int
    eval_failures: int

    def sync_engine(self) -> SyncStats: ...


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Checkpoints their writer completed (renamed from .tmp-step_N), oldest first; `select` verifies them."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name[5:]))


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


# ---------------------------------------------------------------- save


def _make_tmp(state: Checkpointed, tmp: Path, final: Path, rank: int) -> None:
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)


def _write_parts(state: Checkpointed, tmp: Path, final: Path, rank: int) -> None:
    state.backend.save(tmp)  # collective for ZeRO-3
    write_json(tmp / f"rng_rank{rank}.json", rng_state())
    write_json(tmp / f"data_rank{rank}.json", {**state.data.state_dict(), "rows": state.rows.state_dict()})
    if rank == 0:
        meta = {
            "step": state.step,
            "policy_version": state.step,
            "backend": state.backend.name,
            "nonfinite_steps": state.nonfinite_steps,
            "nonfinite_streak": state.nonfinite_streak,
            "eval_failures": state.eval_failures,
        }
        write_json(tmp / "meta.json", meta)
        write_json(tmp / "config.json", to_dict(state.cfg))


def _seal(state: Checkpointed, tmp: Path, final: Path, rank: int) -> None:
    """Once every rank's files are written: the manifest last (every rank hashes its share of the files, rank 0
    writes it), then rank 0's atomic rename, then pruning."""
    write_manifest(tmp, state.step, rank_world(), gather_from_ranks)
    if rank == 0:
        tmp.rename(final)  # a checkpoint directory either exists whole or not at all
        for old in checkpoint_dirs(state.run_dir)[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)


def save(state: Checkpointed) -> Path:
    """Write checkpoints/step_N atomically: every rank writes into .tmp-step_N, rank 0 adds the manifest and renames
    it when all are done. A write that fails (disk full, read-only) on any rank stops every rank alike with a
    RunDirError naming the path and what was kept; the partial directory is removed."""
    root = state.run_dir / "checkpoints"
    final, tmp = root / f"step_{state.step}", root / f".tmp-step_{state.step}"
    if final.exists():
        return final
    rank = _rank()
    for phase in (_make_tmp, _write_parts, _seal):
        error = None
        try:
            phase(state, tmp, final, rank)
        except Exception as e:
            if not is_write_error(e):
                raise
            error = e
        failed = max_over_ranks(rank + 1 if error is not None else 0)  # every rank reaches this: go on or stop
        if failed:  # the manifest is never written: the previous checkpoint stays the newest on every rank
            _fail(state, tmp, error, failed - 1)
    return final


def _fail(state: Checkpointed, tmp: Path, error: BaseException | None, failed_rank: int) -> None:
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    kept = [p.name for p in checkpoint_dirs(state.run_dir)]
    where = getattr(error, "filename", None) or tmp
    cause = (
        f"{describe(error)} (rank {_rank()})"
        if error is not None
        else f"rank {failed_rank} could not write its part (its own error names the file)"
    )
    resume = f"resume continues from {kept[-1]}" if kept else "no checkpoint to resume from"
    raise RunDirError(
        f"could not write checkpoint step_{state.step}: '{where}': {cause}. Kept: {', '.join(kept) or 'nothing'} "
        f"under '{tmp.parent}' ({resume}) and metrics.jsonl up to step {state.step - 1}; the partial {tmp.name} was "
        "removed. Free space or make train.output_dir writable, then rerun with train.resume=true"
    ) from error


# ---------------------------------------------------------------- verify and resume


def _allowed_classes(ckpt: Path) -> set[str]:
    """Classes a checkpoint's torch files may name besides tensors: DeepSpeed's records in ZeRO-3 checkpoints."""
    if load_json(ckpt / "meta.json", "step and backend").get("backend") == "zero3":
        from vlgrpo.trainer.zero3 import PICKLED_CLASSES

        return set(PICKLED_CLASSES)
    return set()


def _newest_verified(found: list[Path], quarantine: bool) -> int:
    """Index of the newest checkpoint whose files match its manifest. Every rank runs this: each hashes its share of
    a checkpoint's files and all reach the same verdict (`check_manifest` gathers them). Rank 0 then reports the
    newer ones that do not verify and, when `quarantine`, renames them rejected-step_N so that no later save or resume
    trips on them; the other ranks return as soon as the verdict is in."""
    rejected: list[tuple[Path, str]] = []
    for i in reversed(range(len(found))):
        why = check_manifest(found[i], rank_world(), gather_from_ranks)
        if why is not None:
            rejected.append((found[i], why))
            continue
        if _rank() != 0:
            return i
        refuse_pickled_code(found[i], _allowed_classes(found[i]))  # verified yet crafted: refuse, never fall back
        for bad, reason in rejected:
            note = ""
            if quarantine:
                moved = bad.with_name(f"{REJECTED}{bad.name}-{time.strftime('%Y%m%d-%H%M%S')}")
                try:
                    bad.rename(moved)
                    note = f"; moved to {moved}"
                except OSError as e:
                    note = f"; could not move it aside ({describe(e)})"
            print(f"[vlgrpo] checkpoint {bad} is not usable: {reason}{note}. Falling back to {found[i].name}")
        return i
    reasons = "; ".join(f"{p.name}: {why}" for p, why in rejected)
    raise CheckpointError(
        f"no checkpoint under '{found[0].parent}' verifies ({reasons}). Nothing was changed: move checkpoints/ "
        "away to start the run over, or choose another train.output_dir"
    )


def select(run_dir: Path, quarantine: bool = True) -> Path | None:
    """The newest checkpoint that verifies, None when the run has none; raises CheckpointError when none verifies
    or the chosen one would unpickle code. Every rank hashes a share; rank 0's choice is every rank's."""
    found = checkpoint_dirs(run_dir)
    if not found:
        return None
    choice, error = -1, None
    try:
        choice = _newest_verified(found, quarantine)
    except Exception as e:  # noqa: BLE001 - re-raised below, once every rank knows there is no choice
        error = e
    choice = from_rank0(choice)
    if choice >= 0:
        return found[choice]
    raise error or CheckpointError(f"rank 0 found no usable checkpoint under '{found[0].parent}' (see its error)")


def resume(state: Checkpointed, for_export: bool = False) -> bool:
    """Load the newest verified checkpoint of the run directory, if any. Returns whether one was loaded. Training
    (not an export) also drops metrics rows logged after it, a half-written last line included."""
    rank, log = _rank(), _rank() == 0 and not for_export
    ckpt = select(state.run_dir, quarantine=not for_export)
    if ckpt is None:
        if log:
            _report_truncation(state.run_dir / "metrics.jsonl", 0)
        return False
    meta = load_json(ckpt / "meta.json", "step and counters")
    state.backend.load(ckpt)
    data = load_json(ckpt / f"data_rank{rank}.json", "data position of this rank")
    state.data.load_state_dict(data)
    state.rows.load_state_dict(data.get("rows", {}))  # the rows it skipped stay skipped and counted
    state.step = int(meta["step"])
    state.nonfinite_steps, state.nonfinite_streak = meta.get("nonfinite_steps", 0), meta.get("nonfinite_streak", 0)
    state.eval_failures = meta.get("eval_failures", 0)
    state.cache.set_step(state.step)
    if state.engine is not None:
        state.sync_engine()
    set_rng_state(load_json(ckpt / f"rng_rank{rank}.json", "RNG state"), ckpt / f"rng_rank{rank}.json")
    if log:
        _report_truncation(state.run_dir / "metrics.jsonl", state.step)
        print(f"[vlgrpo] resumed from {ckpt} (step {state.step})")
    return True


def _report_truncation(path: Path, step: int) -> None:
    later, broken = truncate_metrics(path, step)
    if later or broken:
        print(
            f"[vlgrpo] {path}: dropped {later} rows logged after step {step} and {broken} unreadable lines "
            "(a half-written last line): the resumed run logs those steps again"
        )
