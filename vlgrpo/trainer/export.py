"""`vlgrpo export`: a plain HF checkpoint (LoRA merged, ZeRO-3 gathered) of a run's newest verified checkpoint, with
its processor and the run's prompt contract (vlgrpo.json). Reads the run directory, writes only the export."""

from __future__ import annotations

from pathlib import Path

from vlgrpo.config import ConfigError, load_config
from vlgrpo.config.contract import PromptContract, read_contract
from vlgrpo.models import detect_arch
from vlgrpo.rewards import context_from_config
from vlgrpo.trainer.checkpoint import checkpoint_dirs, select
from vlgrpo.trainer.state import build_state


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """A plain HF checkpoint (LoRA merged, ZeRO-3 gathered) of a run's newest verified checkpoint, processor
    included. The run directory is only read."""
    run = Path(run_dir)
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"'{run}' is not a run directory: it has no config.yaml")
    if not checkpoint_dirs(run):
        raise ConfigError(f"run directory '{run}' has no complete checkpoint under checkpoints/")
    cfg = load_config(run / "config.yaml", ["train.resume=true"])
    if cfg.train.backend == "zero3":
        from vlgrpo.trainer.zero3 import export_checkpoint

        out = export_checkpoint(select(run, quarantine=False), cfg, out_dir)  # one process, any world size
    else:
        state = build_state(cfg, run, progress=False, for_export=True)
        try:
            out = state.backend.export(out_dir, state.lm.processor)
        finally:
            state.close()
    _run_contract(run, cfg, out).write(out)
    return out


def _run_contract(run: Path, cfg, exported: Path):
    """The run's own vlgrpo.json; for a run directory written before there was one, derived from its config."""
    contract = read_contract(run)
    if contract is None:
        arch = detect_arch(str(exported)) if cfg.model.arch == "auto" else cfg.model.arch
        contract = PromptContract.from_config(cfg, arch, context_from_config(cfg, arch).box_format)
    return contract
