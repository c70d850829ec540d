"""Run under torchrun: `vlgrpo train CONFIG` exactly as a user types it, with one fault injected on one rank.

VLGRPO_TEST_FAULT="rank:step:phase:kind": on that rank, in that step, the phase (batch: sampling and rewards, reward,
update, save) raises (kind "raise") or blocks (kind "block"); the moment is written to fault_at.txt beside the config,
so the test can measure how long the other rank took to stop. Used by test_faults.py."""

import os
import sys
import time
from pathlib import Path

from vlgrpo.cli import main
from vlgrpo.trainer import loop

METHODS = {"batch": "_sample_round", "reward": "_rewards", "update": "_update", "save": "_save_if_due"}


def inject(spec: str, out: Path) -> None:
    rank, step, phase, kind = spec.split(":")
    if int(rank) != int(os.environ["RANK"]):
        return
    original = getattr(loop.Trainer, METHODS[phase])

    def faulty(self, *args, **kwargs):
        current = self.state.step if phase == "save" else self.state.step + 1  # save runs after the step counts
        if current == int(step):
            out.write_text(f"{time.time()}\n")
            if kind == "raise":
                raise RuntimeError(f"injected fault on rank {rank} in {phase} at step {step}")
            time.sleep(3600)  # blocks: alive, but no longer taking part
        return original(self, *args, **kwargs)

    setattr(loop.Trainer, METHODS[phase], faulty)


if __name__ == "__main__":
    config = Path(sys.argv[1])
    if os.environ.get("VLGRPO_TEST_FAULT"):
        inject(os.environ["VLGRPO_TEST_FAULT"], config.parent / "fault_at.txt")
    sys.exit(main(["train", str(config), *sys.argv[2:]]))
