"""Run under torchrun: `vlgrpo train CONFIG` exactly as a user types it, with one fault injected on one rank.

VLGRPO_TEST_FAULT="rank:step:phase:kind": on that rank, in that step, the phase (batch: sampling and rewards, reward,
update, save) raises (kind "raise"; kind "input": an InputError, a failure a restart repeats), blocks (kind
"block"), is SIGKILLed (kind "kill", in the launch's first attempt only, so a restarted group runs clean) or, in
save, finds the disk full (kind "enospc": this rank's checkpoint files cannot be written). Kind "abort_at_exit" (any
phase and step) makes the interpreter's teardown abort the rank, as a library object freed in that teardown can; the
moment is written to fault_at.txt beside the config, so the test can measure how long the other rank took to stop.
Used by test_faults.py, and by test_two_nodes.py through `inject/sitecustomize.py`."""

import errno
import os
import signal
import sys
import time
from pathlib import Path

from vlgrpo.cli import main
from vlgrpo.trainer import loop
from vlgrpo.trainer.group import launch_attempt
from vlgrpo.types import InputError

METHODS = {"batch": "_sample_round", "reward": "_rewards", "update": "_update", "save": "_save_if_due"}


def inject(spec: str, out: Path) -> None:
    rank, step, phase, kind = spec.split(":")
    if int(rank) != int(os.environ["RANK"]):
        return
    if kind == "abort_at_exit":
        import atexit

        atexit.register(os.abort)
        return
    if kind == "enospc":
        from vlgrpo.trainer import checkpoint

        write_parts = checkpoint._write_parts

        def full(state, tmp, final, r):
            if state.step == int(step):
                out.write_text(f"{time.time()}\n")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / f"rng_rank{r}.json"))
            return write_parts(state, tmp, final, r)

        checkpoint._write_parts = full
        return
    original = getattr(loop.Trainer, METHODS[phase])

    def faulty(self, *args, **kwargs):
        current = self.state.step if phase == "save" else self.state.step + 1  # save runs after the step counts
        first_attempt = launch_attempt() == 0
        if current == int(step) and (kind != "kill" or first_attempt):
            out.write_text(f"{time.time()}\n")
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "raise":
                raise RuntimeError(f"injected fault on rank {rank} in {phase} at step {step}")
            if kind == "input":
                raise InputError(f"injected permanent fault on rank {rank} in {phase} at step {step}")
            time.sleep(3600)  # blocks: alive, but no longer taking part
        return original(self, *args, **kwargs)

    setattr(loop.Trainer, METHODS[phase], faulty)


if __name__ == "__main__":
    config = Path(sys.argv[1])
    if os.environ.get("VLGRPO_TEST_FAULT"):
        inject(os.environ["VLGRPO_TEST_FAULT"], config.parent / "fault_at.txt")
    sys.exit(main(["train", str(config), *sys.argv[2:]]))
