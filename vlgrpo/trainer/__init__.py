"""Training: the GRPO/SFT loop, backends (plain, LoRA, ZeRO-3), checkpoints and metrics.

`run_training(cfg)` is what `vlgrpo train` calls; the loop itself lives in loop.py.
"""

from __future__ import annotations

from pathlib import Path


def run_training(cfg, run_dir: str | Path | None = None, progress: bool | None = None, evaluator=None) -> list[dict]:
    """Build the run state from the config, resume if a checkpoint exists, train to train.steps.

    A permanent failure (an InputError that is not `transient`: bad config or data, the non-finite limit, a full
    disk, a checkpoint that fails its checksum) is recorded in the run directory, so the ranks torchrun restarts stop
    at once instead of replaying it (`rundir.refuse_replay`); a killed or hung rank, a transient InputError (a judge
    server down, a vanished cache directory) or any other exception restarts and resumes."""
    from vlgrpo.trainer.rundir import mark_permanent_failure, refuse_replay
    from vlgrpo.types import InputError

    directory = Path(run_dir or cfg.train.output_dir)
    refuse_replay(directory)
    try:
        return _train(cfg, run_dir, progress, evaluator)
    except InputError as e:
        if not e.transient:
            mark_permanent_failure(directory, e)
        raise


def _train(cfg, run_dir, progress, evaluator) -> list[dict]:
    from vlgrpo.trainer.group import leave_group
    from vlgrpo.trainer.loop import Trainer
    from vlgrpo.trainer.state import build_state

    state = build_state(cfg, run_dir, progress)
    state.evaluator = evaluator
    try:
        history = Trainer(state).train()
    except BaseException:
        # no barrier here: the other ranks may be inside a collective this rank will never enter; this process
        # exits with the error and the launcher (torchrun) stops them at once
        state.close()
        raise
    state.close()
    leave_group()
    return history
