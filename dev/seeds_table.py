"""The demo's five-seed table (docs/demo-seeds.md, the table of record and its experiment log): each seed's summary
after SFT and after GRPO, the means, and the research targets the demo was tuned against. Research tooling: run by
dev/demo_seeds.sh; the product's demo report is vlgrpo/demo/report.py.
"""

from __future__ import annotations

import json
from pathlib import Path


def _pts(summary: dict, key: str) -> float | None:
    """The lift of `key` from SFT to GRPO in points (None when either side was not evaluated)."""
    b, a = summary.get(f"sft_{key}"), summary.get(f"grpo_{key}")
    return None if b is None or a is None else (a - b) * 100


def _mean(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def seed_targets(summaries: dict[int, dict]) -> list[tuple[str, bool, str]]:
    """(target, met, measured) of the demo's research targets (set in the project's issue #16) over the seeds'
    summaries (`summary.json` of each seed)."""
    runs = list(summaries.values())
    kinds = [k for k in runs[0]["kinds"] if k != "ground"]
    vqa = [_pts(s, "test_accuracy") for s in runs]
    ground = [_pts(s, "grounding_acc50") for s in runs]
    kind_lift = {k: _mean([_pts(s, f"accuracy_{k}") for s in runs]) for k in kinds}
    f1 = [(s["sft_pope_f1"], s["grpo_pope_f1"]) for s in runs]
    yes = [s["grpo_pope_yes_ratio"] for s in runs]
    ratio = [s["final_response_length"] / max(s["initial_response_length"], 1e-9) for s in runs]

    def fmt(values: list) -> str:
        return " / ".join("n/a" if v is None else f"{v:+.1f}" for v in values)

    def at_least(values: list, bound: float) -> bool:
        return all(v is not None and v >= bound for v in values)

    mean_f1 = (_mean([b for b, _ in f1]), _mean([a for _, a in f1]))
    return [
        ("VQA accuracy: mean lift >= +10 points", at_least([_mean(vqa)], 10), f"{_mean(vqa):+.1f}"),
        ("VQA accuracy: every seed >= +5 points", at_least(vqa, 5), fmt(vqa)),
        (
            "VQA accuracy: no kind's mean lift below -2 points",
            at_least(list(kind_lift.values()), -2),
            ", ".join(f"{k} {v:+.1f}" for k, v in kind_lift.items()),
        ),
        ("grounding Acc@0.5: mean lift >= +10 points", at_least([_mean(ground)], 10), fmt([_mean(ground)])),
        ("grounding Acc@0.5: every seed >= +5 points", at_least(ground, 5), fmt(ground)),
        ("POPE F1 after GRPO >= after SFT (mean)", mean_f1[1] >= mean_f1[0], f"{mean_f1[0]:.3f} -> {mean_f1[1]:.3f}"),
        (
            "POPE yes-ratio after GRPO in [0.35, 0.65] on every seed",
            all(0.35 <= y <= 0.65 for y in yes),
            " / ".join(f"{y:.2f}" for y in yes),
        ),
        (
            "entropy > 0.05 over the last GRPO steps",
            all(s["final_grpo_entropy"] > 0.05 for s in runs),
            " / ".join(f"{s['final_grpo_entropy']:.3f}" for s in runs),
        ),
        (
            "response length within 2x of the SFT policy's",
            all(0.5 <= r <= 2 for r in ratio),
            " / ".join(f"{r:.2f}x" for r in ratio),
        ),
        (
            "wall_seconds <= 600",
            all(s["wall_seconds"] <= 600 for s in runs),
            " / ".join(f"{s['wall_seconds']:.0f}" for s in runs),
        ),
    ]


def seeds_markdown(summaries: dict[int, dict], command: str) -> str:
    """docs/demo-seeds.md: one row per seed (SFT -> GRPO), the means, and the targets met or missed."""
    runs = list(summaries.values())
    kinds = [k for k in runs[0]["kinds"] if k != "ground"]

    def pair(s: dict, key: str) -> str:
        b, a = s.get(f"sft_{key}"), s.get(f"grpo_{key}")
        return "n/a" if b is None or a is None else f"{b:.3f} → {a:.3f} ({(a - b) * 100:+.1f})"

    head = [
        "seed",
        "VQA accuracy",
        *[f"{k}" for k in kinds],
        "grounding Acc@0.5",
        "POPE F1",
        "POPE yes-ratio",
        "answered",
        "entropy",
        "length (SFT → last)",
        "wall s",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for seed, s in summaries.items():
        cells = [
            str(seed),
            pair(s, "test_accuracy"),
            *[pair(s, f"accuracy_{k}") for k in kinds],
            pair(s, "grounding_acc50"),
            pair(s, "pope_f1"),
            pair(s, "pope_yes_ratio"),
            pair(s, "answered"),
            f"{s['final_grpo_entropy']:.3f}",
            f"{s['initial_response_length']:.1f} → {s['final_response_length']:.1f}",
            f"{s['wall_seconds']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    means = ["mean"]
    for key in [
        "test_accuracy",
        *[f"accuracy_{k}" for k in kinds],
        "grounding_acc50",
        "pope_f1",
        "pope_yes_ratio",
        "answered",
    ]:
        b, a = _mean([s.get(f"sft_{key}") for s in runs]), _mean([s.get(f"grpo_{key}") for s in runs])
        means.append("n/a" if b is None or a is None else f"{b:.3f} → {a:.3f} ({(a - b) * 100:+.1f})")
    means += [
        f"{_mean([s['final_grpo_entropy'] for s in runs]):.3f}",
        "",
        f"{_mean([s['wall_seconds'] for s in runs]):.0f}",
    ]
    lines.append("| " + " | ".join(means) + " |")
    checks = ["| target | met | measured |", "|---|---|---|"]
    checks += [f"| {t} | {'yes' if ok else '**no**'} | {m} |" for t, ok, m in seed_targets(summaries)]
    first = runs[0]
    steps = first["steps"]
    ground = f"{steps['ground_sft']} SFT steps on the box questions alone, " if "ground_sft" in steps else ""
    return "\n".join(
        [
            "# The demo on five seeds",
            "",
            f"Written by `{command}` (each seed: `vlgrpo demo --seed S`, the README command's defaults). Base "
            f"`{first['base']}`, kinds {', '.join(first['kinds'])}, {ground}{first['steps']['sft']} SFT steps then "
            f"{first['steps']['grpo']} GRPO steps; held-out test split. Each cell: after SFT → after GRPO (lift in "
            f"points). Entropy and the last response length are means over the last {first['collapse_window']} GRPO "
            "steps; the SFT policy's length is the mean over the first 5 GRPO steps. Answered: the share of the test "
            "completions (every suite) whose answer the suites could read, i.e. the answer format held.",
            "",
            *lines,
            "",
            "## Targets (issue #16)",
            "",
            *checks,
            "",
        ]
    )


def _answered(run: Path) -> dict[str, float]:
    """sft_answered / grpo_answered: 1 - the evaluation's `no_answer` share (eval_<stage>/metrics.json)."""
    out = {}
    for stage in ("sft", "grpo"):
        path = run / f"eval_{stage}" / "metrics.json"
        if path.is_file():
            info = json.loads(path.read_text())["info"]
            out[f"{stage}_answered"] = 1 - info["no_answer"] / max(info["samples"], 1)
    return out


NOTES_MARK = "<!-- written by hand below this line: dev/demo_seeds.sh keeps it -->"
"""In docs/demo-seeds.md, the line after which the notes are hand-written; a regenerated table keeps them."""


def write_seeds_doc(run_root: str | Path, out: str | Path, command: str = "dev/demo_seeds.sh") -> Path:
    """Read run_root/seed<S>/summary.json for every seed there and write the seed table to `out`, keeping what `out`
    already holds from its NOTES_MARK line on."""
    root = Path(run_root)
    found = sorted(root.glob("seed*/summary.json"), key=lambda p: int(p.parent.name[4:]))
    if not found:
        raise FileNotFoundError(f"no seed<S>/summary.json under {root}: run dev/demo_seeds.sh first")
    summaries = {int(p.parent.name[4:]): {**json.loads(p.read_text()), **_answered(p.parent)} for p in found}
    path = Path(out)
    old = path.read_text() if path.exists() else ""
    notes = old[old.index(NOTES_MARK) :] if NOTES_MARK in old else ""
    path.write_text(seeds_markdown(summaries, command) + ("\n" + notes if notes else ""))
    return path
