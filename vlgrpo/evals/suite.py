"""What an eval suite is: which samples it runs on, how its completions are scored, and its section of report.md.

Each suite is one module exposing `SUITE` (evals/vqa.py, evals/grounding.py, evals/pope/suite.py), named in
`vlgrpo.registry.EVAL_SUITE`; the runner (`evals/run.py`) and the report (`evals/report.py`) reach suites only
through this record. Adding a suite is its module plus one registry line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlgrpo.registry import EVAL_SUITE
from vlgrpo.rewards.context import RewardContext
from vlgrpo.types import Completion, InputError, Sample

if TYPE_CHECKING:  # the runner resolves it (evals/source.py); suites read it
    from vlgrpo.evals.source import EvalSource

Scores = tuple[dict[str, float], dict[str, int], list[dict]]
"""(metrics without the `eval/<suite>/` prefix, sample counts per group ("" = all), one prediction row per sample)."""


@dataclass(frozen=True)
class PopeOptions:
    """Where the pope suite's probes come from and how they are read (`vlgrpo eval --pope-*`)."""

    data: str | Path | None = None
    """A POPE question file or saved dataset; None: probes built from the data's objects (or the data itself when
    it is a POPE file)."""
    splits: tuple[str, ...] | None = None
    """None: random when built, every split of a POPE file."""
    images: int | None = None
    """Images to build probes from (None: every eligible one)."""
    per_image: int = 3
    min_objects: int = 3
    parser: str = "pope"


@dataclass
class Selection:
    """What `build_eval_data` was asked for; each suite reads what concerns it."""

    source: EvalSource
    """What the data is (`evals/source.py`): suites read this, never the path itself."""
    samples: list[Sample]
    """The source's samples, loaded once (empty for a POPE question file)."""
    max_samples: int | None = None
    pope: PopeOptions = PopeOptions()
    ctx: RewardContext | None = None

    @property
    def pope_file(self) -> str | Path | None:
        """The POPE question file the pope suite reads: --pope-data, else the data itself when it is one."""
        return self.pope.data if self.pope.data is not None else (self.data if self.source.kind == "pope" else None)

    @property
    def data(self) -> str | Path | None:
        """The path, as messages name it."""
        return self.source.path


@dataclass(frozen=True)
class Suite:
    name: str
    needs: str
    """What a dataset must hold for the suite (the error when it holds none)."""
    select: Callable[[Selection], list[Sample]]
    """The suite's samples, checked before any decoding (a bad gold answer is an error here)."""
    score: Callable[[list[Sample], list[Completion], RewardContext, str], Scores]
    """(samples, completions, reward context, POPE parser name) -> Scores; every row has `answered`."""
    report: Callable[[dict[str, float], dict[str, int], dict[str, Any]], list[str]]
    """(metrics, counts, info), keys as `evaluate` writes them -> the markdown lines of its report.md section."""


def load_suite(name: str) -> Suite:
    return EVAL_SUITE.load(name)


def parse_suites(suites: str | list[str] | tuple[str, ...]) -> list[str]:
    names = [s.strip() for s in suites.split(",")] if isinstance(suites, str) else list(suites)
    bad = [s for s in names if s not in EVAL_SUITE.names]
    if bad or not names:
        raise InputError(
            f"eval suites {bad or names} are not accepted; use a comma list of {', '.join(EVAL_SUITE.names)}"
        )
    return names


class EvalData:
    """The samples each suite runs on, by suite name (an empty or missing list: the suite is not run).
    `EvalData(vqa=[...], pope=[...])`; `data.vqa` reads a suite's list."""

    def __init__(self, **suites: list[Sample]) -> None:
        parse_suites(list(suites) or list(EVAL_SUITE.names))
        self.by_suite = dict(suites)

    def __getattr__(self, name: str) -> list[Sample]:
        if name in EVAL_SUITE.names:
            return self.__dict__.get("by_suite", {}).get(name, [])
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"EvalData({', '.join(f'{k}=<{len(v)} samples>' for k, v in self.by_suite.items())})"

    def suites(self) -> dict[str, list[Sample]]:
        """The suites that have samples, in the registry's order."""
        return {name: self.by_suite[name] for name in EVAL_SUITE.names if self.by_suite.get(name)}


@dataclass
class EvalResult:
    metrics: dict[str, float]
    """`eval/<suite>/<metric>`, every value in [0, 1]."""
    predictions: list[dict]
    """One row per evaluated sample: id, suite, task, question, gold, completion, answered, and correct / iou."""
    counts: dict[str, int] = field(default_factory=dict)
    """Samples behind the metrics: "<suite>" and "<suite>/<group>" (answer type, task_<task>, POPE split)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Settings and timing of the run (decoding, parser, seconds, and what the caller adds)."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Files written next to predictions.jsonl, by relative path: the images tools returned (`evals/trajectories`)."""


def prediction_row(suite: str, s: Sample, c: Completion, gold: Any) -> dict:
    """The fields every prediction row starts with."""
    return {
        "id": s.id,
        "suite": suite,
        "task": s.task,
        "question": s.question,
        "gold": gold,
        "completion": c.text,
        "finish_reason": c.finish_reason,
    }
