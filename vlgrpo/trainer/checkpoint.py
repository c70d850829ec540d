"""Checkpoints: everything needed to continue a run bit-for-bit (weights or adapter, optimiser, schedule, RNG
states, data position, step, policy version, resolved config), written atomically; resume; HF export.

A run killed at any moment resumes from its newest complete checkpoint; metrics logged after it are dropped.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from vlgrpo.config import to_dict

if TYPE_CHECKING:
    from vlgrpo.trainer.state import RunState

KEEP = 2
"""Complete checkpoints kept per run (older ones are deleted after a new one is written)."""


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a directory is complete once renamed from its .tmp name)."""
    root = run_dir / "checkpoints"
    found = [p for p in root.glob("step_*") if p.is_dir() and (p / "meta.json").is_file()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def save(state: RunState) -> Path:
    """Write checkpoints/step_N atomically: every rank writes into .tmp-step_N, rank 0 renames it when all are done."""
    root = state.run_dir / "checkpoints"
    final, tmp = root / f"step_{state.step}", root / f".tmp-step_{state.step}"
    if final.exists():
        return final
    rank = _rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    state.backend.save(tmp)  # collective for ZeRO-3
    torch.save(_rng_state(), tmp / f"rng_rank{rank}.pt")
    torch.save({"data": state.data.state_dict()}, tmp / f"data_rank{rank}.pt")
    if rank == 0:
        meta = {"step": state.step, "policy_version": state.step, "backend": state.backend.name}
        (tmp / "meta.json").write_text(json.dumps(meta))
        (tmp / "config.json").write_text(json.dumps(to_dict(state.cfg), indent=1))
    _barrier()
    if rank == 0:
        tmp.rename(final)  # atomic: a checkpoint directory either exists whole or not at all
        for old in checkpoint_dirs(state.run_dir)[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def resume(state: RunState) -> bool:
    """Load the newest complete checkpoint of the run directory, if any. Returns whether one was loaded."""
    found = checkpoint_dirs(state.run_dir)
    if not found:
        return False
    ckpt, rank = found[-1], _rank()
    state.backend.load(ckpt)
    state.data.load_state_dict(torch.load(ckpt / f"data_rank{rank}.pt", weights_only=False)["data"])
    state.step = json.loads((ckpt / "meta.json").read_text())["step"]
    state.cache.set_step(state.step)
    if state.engine is not None:
        state.engine.update_weights(state.backend.named_weights() if state.engine_needs_weights else None, state.step)
    _set_rng_state(torch.load(ckpt / f"rng_rank{rank}.pt", weights_only=False))
    if rank == 0:
        _truncate_metrics(state.run_dir / "metrics.jsonl", state.step)
        print(f"[vlgrpo] resumed from {ckpt} (step {state.step})")
    return True


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after the checkpoint (the resumed run logs those steps again)."""
    if not path.exists():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(r + "\n" for r in rows))


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """A plain HF checkpoint (LoRA merged, ZeRO-3 gathered) of a run's newest checkpoint, processor included."""
    from vlgrpo.config import ConfigError, load_config
    from vlgrpo.trainer.state import build_state

    run = Path(run_dir)
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"'{run}' is not a run directory: it has no config.yaml")
    if not checkpoint_dirs(run):
        raise ConfigError(f"run directory '{run}' has no complete checkpoint under checkpoints/")
    cfg = load_config(run / "config.yaml", ["train.resume=true"])
    newest = checkpoint_dirs(run)[-1]
    if json.loads((newest / "meta.json").read_text())["backend"] == "zero3":
        from vlgrpo.trainer.zero3 import export_checkpoint

        return export_checkpoint(newest, cfg, out_dir)  # one process, any training world size
    state = build_state(cfg, run, progress=False, for_export=True)
    try:
        return state.backend.export(out_dir, state.lm.processor)
    finally:
        state.close()
