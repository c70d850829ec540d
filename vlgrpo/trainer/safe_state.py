"""Pickle-free run state: RNG states and data positions as JSON, tensor files read with `torch.load(weights_only=True)`
only, and a context that makes DeepSpeed's own `torch.load` calls weights-only too.

Nothing here executes code from a run directory; every refusal is a `CheckpointError` naming the file.
Knows nothing of models, backends or the loop.
"""

from __future__ import annotations

import json
import os
import pickle
import random
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlgrpo.types import InputError


class CheckpointError(InputError):
    """A checkpoint file that is missing, truncated, altered, or would run code when loaded; names the file."""


# ---------------------------------------------------------------- JSON files


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj))


def load_json(path: Path, what: str) -> Any:
    """A JSON file of a checkpoint (`what` says which: 'RNG state', 'data position', ...)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file '{path}' ({what}) is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint file '{path}' ({what}) is unreadable: {e}") from None


# ---------------------------------------------------------------- RNG states


def rng_state() -> dict:
    """Python, NumPy, torch (and CUDA) generator states as JSON-ready lists of numbers."""
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(words), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict, path: Path) -> None:
    """Restore `rng_state()`'s output, read from `path` (named in the error when it is not such a state)."""
    try:
        version, words, gauss = state["python"]
        random.setstate((int(version), tuple(int(w) for w in words), None if gauss is None else float(gauss)))
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((str(name), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint file '{path}' is not an RNG state written by vlgrpo: {e!r}") from None


# ---------------------------------------------------------------- tensor files


def load_tensors(path: Path) -> Any:
    """A `torch.save` file of tensors and plain containers (state dicts), loaded on the CPU with weights_only=True:
    a file that needs any other class (pickled code) is refused, a truncated one is reported as such."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file '{path}' is missing") from None
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"checkpoint file '{path}' was refused: it holds pickled objects other than tensors and plain containers "
            f"({first}). vlgrpo loads run files with torch.load(weights_only=True) only; this file was not written "
            "by vlgrpo or was altered"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"checkpoint file '{path}' is truncated or corrupt: {e}") from None


@contextmanager
def weights_only_loads(classes: list[type]):
    """Every `torch.load` inside (third-party code included, whatever it passes) runs with weights_only=True, with
    `classes` allowed besides tensors and plain containers. Used around DeepSpeed's checkpoint loads, which pass
    weights_only off themselves; PyTorch's TORCH_FORCE_WEIGHTS_ONLY_LOAD overrides that argument."""
    key, before = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ[key] = "1"
    try:
        with torch.serialization.safe_globals(classes):
            yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
