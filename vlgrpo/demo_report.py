"""The demo's report: a markdown page (before/after tables, collapse indicators) and PNG curves.

Reads plain dicts (metrics rows, summary); knows nothing of models. matplotlib is optional: without it the report
says so and skips the picture.
"""

from __future__ import annotations

import json
from pathlib import Path


def _smooth(values: list[float], k: int = 10) -> list[float]:
    return [sum(values[max(0, i - k + 1) : i + 1]) / len(values[max(0, i - k + 1) : i + 1]) for i in range(len(values))]


def plot_curves(path: Path, sft: list[dict], grpo: list[dict]) -> bool:
    """SFT loss; GRPO reward and train accuracy (10-step means) with the val accuracy points; entropy, KL and
    response length. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot([h["step"] for h in sft], [h["train/loss"] for h in sft])
    axes[0].set(title="SFT loss", xlabel="step", yscale="log")
    steps = [h["step"] for h in grpo]
    for key, label in (("reward/total", "reward"), ("reward/accuracy", "accuracy (train rollouts)")):
        axes[1].plot(steps, _smooth([h.get(key, 0.0) for h in grpo]), label=label)
    val = [(h["step"], h["eval/vqa/accuracy"]) for h in grpo if "eval/vqa/accuracy" in h]
    if val:
        axes[1].plot(*zip(*val), "o-", label="accuracy (val, greedy)")
    axes[1].set(title="GRPO reward and accuracy", xlabel="step")
    axes[1].legend()
    axes[2].plot(steps, [h.get("grpo/entropy", 0.0) for h in grpo], label="entropy")
    axes[2].plot(steps, [h.get("grpo/kl", 0.0) * 10 for h in grpo], label="KL to SFT x10")
    axes[2].plot(steps, [h.get("grpo/response_length", 0.0) / 10 for h in grpo], label="length / 10")
    axes[2].set(title="collapse indicators", xlabel="step")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _rows(before: dict, after: dict) -> list[str]:
    keys = sorted(k for k in set(before) | set(after) if k.startswith("eval/"))
    lines = ["| metric | after SFT | after GRPO | change |", "|---|---:|---:|---:|"]
    for k in keys:
        b, a = before.get(k), after.get(k)
        delta = f"{a - b:+.3f}" if isinstance(a, float) and isinstance(b, float) else ""
        lines.append(f"| {k} | {b if b is None else f'{b:.3f}'} | {a if a is None else f'{a:.3f}'} | {delta} |")
    return lines


def _headline(summary: dict, key: str, title: str) -> str:
    b, a = summary[f"sft_{key}"], summary[f"grpo_{key}"]
    if b is None or a is None:
        return f"{title}: not evaluated (no such questions among the demo's kinds {summary['kinds']})."
    return f"{title}: **{b:.3f} after SFT → {a:.3f} after GRPO** ({(a - b) * 100:+.1f} points)."


def _per_kind(summary: dict) -> list[str]:
    """One line: each VQA kind's test accuracy after SFT and after GRPO (compare, motion, count, ...)."""
    pairs = [(k, summary.get(f"sft_accuracy_{k}"), summary.get(f"grpo_accuracy_{k}"))
             for k in summary["kinds"] if k != "ground"]
    cells = [f"{k} {b:.3f} → {a:.3f} ({(a - b) * 100:+.1f})" for k, b, a in pairs if b is not None and a is not None]
    return [f"Per kind (VQA, after SFT → after GRPO): {'; '.join(cells)}.", ""] if cells else []


def _pope_note(summary: dict) -> list[str]:
    if "exist" in summary["kinds"] or summary.get("sft_pope_f1") is None:  # no POPE: no note about it
        return []
    return ["POPE probes ask yes/no questions the demo never trains (no `exist` among its kinds): they exercise the "
            "eval path, and the POPE parser reads any answer without 'no' as yes.", ""]  # fmt: skip


def write_report(out: Path, summary: dict, sft: list[dict], grpo: list[dict], before: dict, after: dict) -> Path:
    has_plot = plot_curves(out / "curves.png", sft, grpo)
    lines = [
        "# vlgrpo demo report",
        "",
        f"{_headline(summary, 'test_accuracy', 'Held-out test accuracy (VQA questions)')} "
        f"{_headline(summary, 'grounding_acc50', 'Grounding Acc@0.5')} "
        f"Wall time {summary['wall_seconds']:.0f} s.",
        "",
        *_per_kind(summary),
        *_pope_note(summary),
        f"Collapse indicators over the last {summary['collapse_window']} GRPO steps: entropy "
        f"{summary['final_grpo_entropy']:.3f}, KL to the SFT policy {summary['final_grpo_kl']:.4f}, mean response "
        f"length {summary['final_response_length']:.1f} tokens (the SFT policy's: "
        f"{summary['initial_response_length']:.1f}, over the first 5 GRPO steps).",
        "",
        "![curves](curves.png)" if has_plot else "(install matplotlib for curves.png)",
        "",
        "## Before and after GRPO",
        "",
        *_rows(before, after),
        "",
        "Per-sample predictions: `eval_sft/predictions.jsonl`, `eval_grpo/predictions.jsonl`. Training metrics: "
        "`sft/metrics.jsonl`, `grpo/metrics.jsonl`.",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------- the seed table (dev/demo_seeds.sh)


def _pts(summary: dict, key: str) -> float | None:
    """The lift of `key` from SFT to GRPO in points (None when either side was not evaluated)."""
    b, a = summary.get(f"sft_{key}"), summary.get(f"grpo_{key}")
    return None if b is None or a is None else (a - b) * 100


def _mean(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def seed_targets(summaries: dict[int, dict]) -> list[tuple[str, bool, str]]:
    """(target, met, measured) for issue #16's targets over the seeds' summaries (`summary.json` of each seed)."""
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
        ("VQA accuracy: no kind's mean lift below -2 points", at_least(list(kind_lift.values()), -2),
         ", ".join(f"{k} {v:+.1f}" for k, v in kind_lift.items())),
        ("grounding Acc@0.5: mean lift >= +10 points", at_least([_mean(ground)], 10), fmt([_mean(ground)])),
        ("grounding Acc@0.5: every seed >= +5 points", at_least(ground, 5), fmt(ground)),
        ("POPE F1 after GRPO >= after SFT (mean)", mean_f1[1] >= mean_f1[0], f"{mean_f1[0]:.3f} -> {mean_f1[1]:.3f}"),
        ("POPE yes-ratio after GRPO in [0.35, 0.65] on every seed", all(0.35 <= y <= 0.65 for y in yes),
         " / ".join(f"{y:.2f}" for y in yes)),
        ("entropy > 0.05 over the last GRPO steps", all(s["final_grpo_entropy"] > 0.05 for s in runs),
         " / ".join(f"{s['final_grpo_entropy']:.3f}" for s in runs)),
        ("response length within 2x of the SFT policy's", all(0.5 <= r <= 2 for r in ratio),
         " / ".join(f"{r:.2f}x" for r in ratio)),
        ("wall_seconds <= 600", all(s["wall_seconds"] <= 600 for s in runs),
         " / ".join(f"{s['wall_seconds']:.0f}" for s in runs)),
    ]  # fmt: skip


def seeds_markdown(summaries: dict[int, dict], command: str) -> str:
    """docs/demo-seeds.md: one row per seed (SFT -> GRPO), the means, and the targets met or missed."""
    runs = list(summaries.values())
    kinds = [k for k in runs[0]["kinds"] if k != "ground"]

    def pair(s: dict, key: str) -> str:
        b, a = s.get(f"sft_{key}"), s.get(f"grpo_{key}")
        return "n/a" if b is None or a is None else f"{b:.3f} → {a:.3f} ({(a - b) * 100:+.1f})"

    head = ["seed", "VQA accuracy", *[f"{k}" for k in kinds], "grounding Acc@0.5", "POPE F1", "POPE yes-ratio",
            "answered", "entropy", "length (SFT → last)", "wall s"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for seed, s in summaries.items():
        cells = [str(seed), pair(s, "test_accuracy"), *[pair(s, f"accuracy_{k}") for k in kinds],
                 pair(s, "grounding_acc50"), pair(s, "pope_f1"), pair(s, "pope_yes_ratio"), pair(s, "answered"),
                 f"{s['final_grpo_entropy']:.3f}",
                 f"{s['initial_response_length']:.1f} → {s['final_response_length']:.1f}", f"{s['wall_seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    means = ["mean"]
    for key in ["test_accuracy", *[f"accuracy_{k}" for k in kinds], "grounding_acc50", "pope_f1", "pope_yes_ratio",
                "answered"]:
        b, a = _mean([s.get(f"sft_{key}") for s in runs]), _mean([s.get(f"grpo_{key}") for s in runs])
        means.append("n/a" if b is None or a is None else f"{b:.3f} → {a:.3f} ({(a - b) * 100:+.1f})")
    means += [f"{_mean([s['final_grpo_entropy'] for s in runs]):.3f}", "",
              f"{_mean([s['wall_seconds'] for s in runs]):.0f}"]
    lines.append("| " + " | ".join(means) + " |")
    checks = ["| target | met | measured |", "|---|---|---|"]
    checks += [f"| {t} | {'yes' if ok else '**no**'} | {m} |" for t, ok, m in seed_targets(summaries)]
    first = runs[0]
    steps = first["steps"]
    ground = f"{steps['ground_sft']} SFT steps on the box questions alone, " if "ground_sft" in steps else ""
    return "\n".join([
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
    ])  # fmt: skip


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
    notes = old[old.index(NOTES_MARK):] if NOTES_MARK in old else ""
    path.write_text(seeds_markdown(summaries, command) + ("\n" + notes if notes else ""))
    return path
