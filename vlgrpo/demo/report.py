"""The demo's report: a markdown page (before/after tables, collapse indicators) and PNG curves.

Reads plain dicts (metrics rows, summary); knows nothing of models. matplotlib is optional: without it the report
says so and skips the picture.
"""

from __future__ import annotations

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
    pairs = [
        (k, summary.get(f"sft_accuracy_{k}"), summary.get(f"grpo_accuracy_{k}"))
        for k in summary["kinds"]
        if k != "ground"
    ]
    cells = [f"{k} {b:.3f} → {a:.3f} ({(a - b) * 100:+.1f})" for k, b, a in pairs if b is not None and a is not None]
    return [f"Per kind (VQA, after SFT → after GRPO): {'; '.join(cells)}.", ""] if cells else []


def _pope_note(summary: dict) -> list[str]:
    if "exist" in summary["kinds"] or summary.get("sft_pope_f1") is None:  # no POPE: no note about it
        return []
    return [
        "POPE probes ask yes/no questions the demo never trains (no `exist` among its kinds): they exercise the "
        "eval path, and the POPE parser reads any answer without 'no' as yes.",
        "",
    ]


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


TOOL_ROWS = (
    ("accuracy", "test accuracy", "{:.3f}"),
    ("calls_per_sample", "calls per sample", "{:.2f}"),
    ("crop_hits", "crops holding the asked-about shape", "{:.2f}"),
    ("errors", "tool errors (of the test rows)", "{:.0f}"),
    ("crop_area", "crop area (share of the image)", "{:.3f}"),
)


def write_tool_report(out: Path, summary: dict) -> Path:
    """report.md of `vlgrpo demo --tools`: both arms after SFT and after GRPO side by side, seconds per GRPO step,
    and the first trajectories of the tool arm's final eval with their crops (`tool/eval_grpo/crops/`)."""
    import json

    from vlgrpo.evals.trajectories import CROPS, trajectory_lines

    arms = [a for a in ("tool", "plain") if f"{a}_sft" in summary]
    head = [f"{a} arm, {stage}" for a in arms for stage in ("SFT", "GRPO")]
    lines = [
        "# vlgrpo tool demo: thinking with images on the synth zoom task",
        "",
        f"Seed {summary['seed']}; {summary['wall_seconds']:.0f} s in all. The colour of a small shape in a named cell "
        "of an 896 px image the base sees at 224 px: the tool arm zooms in on the cell, the plain arm answers from "
        "the squeezed image. Greedy, held-out test split.",
        "",
        "| | " + " | ".join(head) + " |",
        "|---" * (len(head) + 1) + "|",
    ]
    for key, label, fmt in TOOL_ROWS:
        cells = [summary[f"{a}_{st}"].get(key) for a in arms for st in ("sft", "grpo")]
        lines.append(f"| {label} | " + " | ".join("–" if v is None else fmt.format(v) for v in cells) + " |")
    per_step = summary.get("grpo_seconds_per_step", {})
    lines += ["", "Seconds per GRPO step: " + ", ".join(f"{a} {per_step[a]:.2f}" for a in arms if a in per_step)]
    predictions = out / "tool" / "eval_grpo" / "predictions.jsonl"
    if predictions.is_file():
        rows = [json.loads(line) for line in predictions.read_text().splitlines() if line.strip()]
        shown = trajectory_lines(rows)
        lines += [line.replace(f"]({CROPS}/", f"](tool/eval_grpo/{CROPS}/") for line in shown]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
