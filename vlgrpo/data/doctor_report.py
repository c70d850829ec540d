"""What `vlgrpo data doctor` was asked (`DoctorSettings`) and what it reports: its findings (severity, check, split,
row, message), each split's statistics, the report as JSON (`DoctorReport.to_dict`) and as the table it prints
(`format_report`). The checks themselves are `data/doctor.py`."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from vlgrpo.data.images import DEFAULT_GEOMETRY, ProcessorGeometry
from vlgrpo.data.rowcheck import DEFAULT_SYSTEM_TOKENS, TEMPLATE_TOKENS, VISION_WRAP
from vlgrpo.data.video import VideoSampling

ERROR, WARNING = "error", "warning"
CHARS_PER_TOKEN = 3
"""Text estimate: Qwen's BPE averages ~4 characters per English token; 3 errs on the long side."""


@dataclass(frozen=True)
class DoctorSettings:
    """What the checks compare against: the processor geometry and the run's prompt settings."""

    geometry: ProcessorGeometry = DEFAULT_GEOMETRY
    geometry_source: str = "released Qwen processor defaults"
    max_prompt_length: int = 1024
    answer_format: str = "think_answer"
    box_format: str = "qwen2_5"
    system_prompt: str = ""
    data_format: str = "auto"
    preset: str = "none"
    """data.preset: the rows are in another project's shape (vlgrpo.data.presets), converted as training does."""
    columns: dict[str, str] = field(default_factory=dict)
    """data.columns: renames target=source applied first."""
    video: VideoSampling = VideoSampling()
    """data.video: how frames are taken from a video and their pixel bounds."""
    video_timestamps: bool = False
    """The model writes a video's time before each temporal patch (Qwen3-VL): counted in the length budget."""
    max_new_tokens: int = 128
    """rollout.max_new_tokens: the tokens of one turn."""
    max_turns: int = 1
    """rollout.max_turns: above 1, each row's whole trajectory (turns, tool responses and crops) is checked too."""
    max_total_length: int | None = None
    """rollout.max_total_length resolved (`vlgrpo.memory.from_config.total_length`); None: no trajectory check."""


@dataclass
class Finding:
    severity: str
    check: str
    split: str
    source: str
    row: int | None
    sample_id: str | None
    message: str
    field: str | None = None

    def where(self) -> str:
        row = f", row {self.row}" if self.row is not None else ""
        sid = f" (id {self.sample_id!r})" if self.sample_id is not None else ""
        return f"{self.source}{row}{sid}"


@dataclass
class SplitStats:
    name: str
    source: str
    rows: int = 0
    samples: int = 0
    images: int = 0
    videos: int = 0
    image_tokens: list[int] = field(default_factory=list)
    """Visual tokens of each sample whose images and video are usable (every image and the video together)."""
    prompt_tokens_max: int = 0
    answer_types: Counter = field(default_factory=Counter)
    tasks: Counter = field(default_factory=Counter)
    answers: dict[str, Counter] = field(default_factory=dict)
    """answer_type -> Counter of normalised gold answers (box samples are not counted)."""
    ids: dict[str, int] = field(default_factory=dict)
    """Sample id -> the row it first appears in."""

    def to_dict(self) -> dict[str, Any]:
        toks = sorted(self.image_tokens)
        return {
            "source": self.source,
            "rows": self.rows,
            "samples": self.samples,
            "images": self.images,
            "videos": self.videos,
            "image_tokens": {"min": toks[0], "median": toks[len(toks) // 2], "max": toks[-1]} if toks else None,
            "prompt_tokens_max_estimate": self.prompt_tokens_max,
            "answer_types": dict(self.answer_types),
            "tasks": dict(self.tasks),
            "top_answers": {kind: dict(c.most_common(5)) for kind, c in self.answers.items()},
        }


@dataclass
class DoctorReport:
    settings: DoctorSettings
    splits: dict[str, SplitStats] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(f.severity == ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == WARNING for f in self.findings)

    def by_check(self) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {}
        for f in sorted(self.findings, key=lambda f: (f.severity != ERROR, f.check)):
            out.setdefault(f.check, []).append(f)
        return out

    def to_dict(self, max_per_check: int = 100) -> dict[str, Any]:
        """JSON-ready: counts per check, the first `max_per_check` findings of each, settings and split stats."""
        s = self.settings
        checks = self.by_check()
        return {
            "ok": self.errors == 0,
            "errors": self.errors,
            "warnings": self.warnings,
            "settings": {**dataclasses.asdict(s), "geometry": dataclasses.asdict(s.geometry)},
            "splits": {name: st.to_dict() for name, st in self.splits.items()},
            "checks": {c: {"severity": fs[0].severity, "count": len(fs)} for c, fs in checks.items()},
            "findings": [dataclasses.asdict(f) for fs in checks.values() for f in fs[:max_per_check]],
        }


def format_report(report: DoctorReport, examples: int = 5) -> str:
    """The table `vlgrpo data doctor` prints: settings, one row per split, one per check, first findings."""
    s, g = report.settings, report.settings.geometry
    lines = [
        f"geometry: patch {g.patch_size}, merge {g.merge_size}, pixels {g.min_pixels}..{g.max_pixels} "
        f"({s.geometry_source}); box format {s.box_format}; answer format {s.answer_format}",
        f"prompt tokens = image and video tokens + {TEMPLATE_TOKENS} template + {VISION_WRAP} per image or video + "
        f"{DEFAULT_SYSTEM_TOKENS} default system + text chars / {CHARS_PER_TOKEN} (an estimate on the long side); "
        f"data.max_prompt_length = {s.max_prompt_length}; video: {s.video.fps:g} fps, at most {s.video.max_frames} "
        "frames"
        + (f"; rollout.max_total_length = {s.max_total_length} over {s.max_turns} turns" if s.max_turns > 1 else ""),
        "",
    ]
    w = max([5, *map(len, report.splits)]) + 2
    lines.append(
        f"{'split':<{w}}{'rows':>8}{'samples':>9}{'images':>8}{'videos':>8}  {'visual tokens min/med/max':>25}"
        f"{'prompt max':>12}  source"
    )
    for name, st in report.splits.items():
        d = st.to_dict()
        toks = "/".join(str(d["image_tokens"][k]) for k in ("min", "median", "max")) if d["image_tokens"] else "-"
        lines.append(
            f"{name:<{w}}{st.rows:>8}{st.samples:>9}{st.images:>8}{st.videos:>8}  {toks:>25}"
            f"{st.prompt_tokens_max:>12}  {st.source}"
        )
    for name, st in report.splits.items():
        if st.samples:
            kinds = ", ".join(f"{k} {v}" for k, v in st.answer_types.most_common())
            tasks = ", ".join(f"{k} {v}" for k, v in st.tasks.most_common(8))
            lines += ["", f"{name}: answer types: {kinds}", f"{name}: tasks: {tasks}"]
            for kind, c in st.answers.items():
                lines.append(f"{name}: top {kind} answers: " + ", ".join(f"{a!r} {n}" for a, n in c.most_common(5)))
    checks = report.by_check()
    if checks:
        lines += ["", f"{'check':<24}{'severity':<10}{'count':>7}"]
        lines += [f"{c:<24}{fs[0].severity:<10}{len(fs):>7}" for c, fs in checks.items()]
        lines += ["", f"first {examples} findings of each check:"]
        for fs in checks.values():
            lines += [f"  {f.severity.upper():<8}{f.check}: {f.where()}: {f.message}" for f in fs[:examples]]
    verdict = "fix the errors before training" if report.errors else "ready"
    lines += ["", f"{report.errors} error(s), {report.warnings} warning(s): {verdict}"]
    return "\n".join(lines)
