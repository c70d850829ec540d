"""A seeded, resumable stream of samples: a fresh permutation each epoch, position saved in checkpoints.

Knows nothing of models; the trainer asks for the next k samples and stores `state_dict()` with each checkpoint.
"""

from __future__ import annotations

import random

from vlgrpo.types import Sample


class SampleStream:
    def __init__(self, samples: list[Sample], seed: int = 0, shuffle: bool = True) -> None:
        if not samples:
            raise ValueError("the training set is empty: nothing to sample")
        self.samples, self.seed, self.shuffle = samples, seed, shuffle
        self.epoch, self.index = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def next(self, k: int) -> list[Sample]:
        """The next k samples, crossing into a new (re-shuffled) epoch when needed."""
        out = []
        while len(out) < k:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self.samples[self._order[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "size": len(self.samples)}

    def load_state_dict(self, state: dict) -> None:
        if state["size"] != len(self.samples) or state["seed"] != self.seed:
            raise ValueError(
                f"cannot resume the data position: the checkpoint saw {state['size']} samples with seed "
                f"{state['seed']}, now {len(self.samples)} with seed {self.seed} (data.train or train.seed changed)"
            )
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._permutation(self.epoch)
