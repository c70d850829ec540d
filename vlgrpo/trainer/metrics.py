"""Metrics: phase timers (`timing/*`), memory probes (`memory/*`), and the logger that writes metrics.jsonl
(always), TensorBoard and wandb (when configured), plus the progress bar; resume's truncation of metrics.jsonl.

Knows nothing of models or GRPO; callers pass flat dicts of numbers with namespaced keys.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from vlgrpo.trainer.rundir import RunDirError, describe


class Timers:
    """`with timers("rollout"): ...` accumulates seconds per phase; `pop()` returns `timing/<phase>` and resets."""

    def __init__(self) -> None:
        self._acc: dict[str, float] = {}
        self.on_phase = None
        """Called with each phase's name on entry and "after <phase>" on exit (the watchdog's progress beat)."""

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        if self.on_phase is not None:
            self.on_phase(phase)
        try:
            yield
        finally:
            self._acc[phase] = self._acc.get(phase, 0.0) + time.perf_counter() - t0
            if self.on_phase is not None:
                self.on_phase(f"after {phase}")

    def pop(self) -> dict[str, float]:
        out = {f"timing/{k}": v for k, v in self._acc.items()}
        self._acc.clear()
        return out


def memory_metrics() -> dict[str, float]:
    """Peak resident memory of this process (GB) and, on CUDA, the peak allocated memory (GB)."""
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    out = {"memory/peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e9}
    if torch.cuda.is_available():
        out["memory/cuda_max_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return out


def _clean(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible as strings
    return value


class MetricsLogger:
    """Appends one JSON object per logged step to `<run>/metrics.jsonl`; mirrors to TensorBoard / wandb."""

    def __init__(
        self,
        run_dir: str | Path,
        tensorboard: bool = False,
        wandb_project: str | None = None,
        config: dict | None = None,
        progress_total: int | None = None,
        progress: bool = True,
        enabled: bool = True,
    ) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled  # False on ranks > 0 and for exports: nothing is written
        self._tb = self._wandb = self._bar = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError("logging.tensorboard=true needs `pip install tensorboard`") from e
            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if wandb_project:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("logging.wandb_project is set: `pip install wandb` (or vlgrpo[wandb])") from e
            self._wandb = wandb.init(project=wandb_project, config=config, dir=str(run_dir))
        if progress and progress_total:
            from tqdm import tqdm

            self._bar = tqdm(total=progress_total, desc="train", unit="step", dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as e:
            raise RunDirError(
                f"could not append the metrics of step {step} to '{self.path}': {describe(e)}. Rows of the earlier "
                "steps and the checkpoints are kept; free space and rerun with train.resume=true"
            ) from e
        numeric = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self._bar is not None:
            self._bar.n = step
            shown = {"reward": "reward/total", "acc": "reward/accuracy", "s/step": "timing/step", "loss": "train/loss"}
            self._bar.set_postfix({k: f"{row[m]:.3g}" for k, m in shown.items() if isinstance(row.get(m), float)})
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def truncate_metrics(path: Path, step: int) -> tuple[int, int]:
    """Keep the rows of steps <= `step` (a resumed run logs the later ones again); drop unreadable lines too, such as
    the half-written last line of a killed run. Rewritten atomically. Returns (rows dropped, lines unreadable)."""
    if not path.exists():
        return 0, 0
    kept, later, broken = [], 0, 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row_step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            broken += 1
            continue
        if isinstance(row_step, int) and row_step <= step:
            kept.append(line)
        else:
            later += 1
    if later or broken:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(r + "\n" for r in kept))
        os.replace(tmp, path)
    return later, broken


class UnionMeans:
    """Metrics that are means over the items of a step (tokens, completions, groups), or maxima, kept as sums and
    weights so that micro-batches and ranks combine into the value of the union batch (`reduce`): what one process
    on every rank's rows would log. Before, the log showed rank 0's unweighted mean of its micro-batch means (rank 0
    with micro-batches of 10 tokens at KL 0.10 and 90 at 0.01, rank 1 with 300 at 0.20: 0.055 logged, 0.155 the
    union's). Keys named in `sums` add up over ranks instead (counts)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.maxima: dict[str, float] = {}
        self.counts: dict[str, float] = {}

    def add(self, values: dict[str, float], weights: float | dict[str, float]) -> None:
        """Means over `weights` items each (one weight for all, or per key)."""
        for k, v in values.items():
            w = float(weights[k] if isinstance(weights, dict) else weights)
            self.sums[k] = self.sums.get(k, 0.0) + (float(v) * w if w else 0.0)  # no item: a NaN mean adds nothing
            self.weights[k] = self.weights.get(k, 0.0) + w

    def add_max(self, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.maxima[k] = max(self.maxima.get(k, -math.inf), float(v))

    def add_count(self, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.counts[k] = self.counts.get(k, 0.0) + float(v)

    def merge(self, other: UnionMeans) -> None:
        """Add `other`'s means, maxima and counts to these."""
        for k in other.sums:
            self.sums[k] = self.sums.get(k, 0.0) + other.sums[k]
            self.weights[k] = self.weights.get(k, 0.0) + other.weights[k]
        self.add_max(other.maxima)
        self.add_count(other.counts)

    def reduce(self, gather=None) -> dict[str, float]:
        """The union's values: `gather(obj) -> [every rank's obj]` (None: this process alone). A mean whose items
        weigh 0 in all (no token) is 0."""
        parts = (
            gather((self.sums, self.weights, self.maxima, self.counts))
            if gather
            else [(self.sums, self.weights, self.maxima, self.counts)]
        )
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        out: dict[str, float] = {}
        for s, w, m, c in parts:
            for k in s:
                sums[k], weights[k] = sums.get(k, 0.0) + s[k], weights.get(k, 0.0) + w[k]
            for k, v in m.items():
                out[k] = max(out.get(k, -math.inf), v)
            for k, v in c.items():
                out[k] = out.get(k, 0.0) + v
        out.update({k: sums[k] / weights[k] if weights[k] > 0 else 0.0 for k in sums})
        return out


def mean_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each key over the parts (micro-batches); a part without the key counts as 0."""
    keys = {k for p in parts for k in p}
    return {k: sum(p.get(k, 0.0) for p in parts) / len(parts) for k in keys}


def add_routing_metrics(means: UnionMeans, routing, model) -> None:
    """A MoE batch's `moe/*` metrics (`policy.routing.routing_metrics`) into `means`; nothing for a dense model."""
    from vlgrpo.policy.routing import control_of, routing_metrics

    control = control_of(model) if routing is not None else None
    if control is None:
        return
    averaged, maxima = routing_metrics(routing, control.num_experts)
    for name, (value, items) in averaged.items():
        means.add({name: value}, items)
    means.add_max(maxima)
