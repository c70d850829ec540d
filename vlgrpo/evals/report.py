"""Eval outputs: `metrics.json` (metrics, sample counts, settings), `predictions.jsonl` (one row per sample) and
`report.md` (a markdown table per suite, a few example answers).

Formatting only: reads the metrics / counts / predictions an eval produced; knows nothing of models or scoring.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vlgrpo.evals.run import EvalResult

GROUNDING_COLUMNS = {"acc50": "Acc@0.5", "acc75": "Acc@0.75", "miou": "mIoU", "parse_fail": "parse fail"}
POPE_COLUMNS = ("accuracy", "precision", "recall", "f1", "yes_ratio", "unknown")
EXAMPLES = 3
"""Example answers shown per suite in report.md."""


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    text = str(value).replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= 120 else text[:117] + "..."


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]


def _groups(counts: dict[str, int], suite: str) -> list[str]:
    """The suite's sub-groups in the order they were counted (answer types, task_<task>, POPE splits)."""
    return [k[len(suite) + 1 :] for k in counts if k.startswith(f"{suite}/")]


def _label(group: str) -> str:
    return f"task {group[len('task_'):]}" if group.startswith("task_") else group


def _vqa(metrics: dict, counts: dict) -> list[str]:
    rows = [["all", counts["vqa"], metrics["eval/vqa/accuracy"]]]
    rows += [[_label(g), counts[f"vqa/{g}"], metrics[f"eval/vqa/accuracy_{g}"]] for g in _groups(counts, "vqa")]
    return ["## VQA accuracy", "", *_table(["group", "n", "accuracy"], rows)]


def _grounding(metrics: dict, counts: dict) -> list[str]:
    cols = list(GROUNDING_COLUMNS)
    rows = [["all", counts["grounding"], *(metrics[f"eval/grounding/{c}"] for c in cols)]]
    rows += [[_label(g), counts[f"grounding/{g}"], *(metrics[f"eval/grounding/{c}_{g}"] for c in cols)]
             for g in _groups(counts, "grounding")]  # fmt: skip
    head = ["group", "n", *GROUNDING_COLUMNS.values()]
    return ["## Grounding (REC, IoU of the first box in original-image pixels)", "", *_table(head, rows)]


def _pope(metrics: dict, counts: dict, parser: str) -> list[str]:
    splits = _groups(counts, "pope")
    if len(splits) == 1:
        rows = [[splits[0], counts["pope"], *(metrics[f"eval/pope/{c}"] for c in POPE_COLUMNS)]]
    else:
        rows = [[s, counts[f"pope/{s}"], *(metrics[f"eval/pope/{s}/{c}"] for c in POPE_COLUMNS)] for s in splits]
        rows.append(["mean", counts["pope"], *(metrics[f"eval/pope/{c}"] for c in POPE_COLUMNS)])
    note = "yes_ratio: share of *predictions* that are yes; unknown: share of answers the parser could not read."
    return [f"## POPE (parser `{parser}`)", "", *_table(["split", "n", *POPE_COLUMNS], rows), "", note]


def _examples(predictions: list[dict], suite: str) -> list[str]:
    rows = [[p["id"], p["question"], p["gold"], p["completion"], p.get("correct", p.get("iou"))]
            for p in predictions if p["suite"] == suite][:EXAMPLES]  # fmt: skip
    return ["", f"Examples ({suite}):", "", *_table(["id", "question", "gold", "completion", "score"], rows)]


def format_report(metrics: dict[str, float], counts: dict[str, int], info: dict, predictions: list[dict]) -> str:
    """The markdown report: settings, then one table per suite that ran (+ a few example answers)."""
    settings = [[k, v] for k, v in info.items() if k not in ("suites", "vision_cache") and v is not None]
    lines = ["# Evaluation report", "", *_table(["setting", "value"], settings)]
    sections = {"vqa": lambda: _vqa(metrics, counts), "grounding": lambda: _grounding(metrics, counts),
                "pope": lambda: _pope(metrics, counts, info.get("pope_parser", "pope"))}  # fmt: skip
    for suite in info.get("suites", []):
        lines += ["", *sections[suite](), *_examples(predictions, suite)]
    return "\n".join(lines) + "\n"


def write_outputs(result: EvalResult, out_dir: str | Path) -> dict[str, Path]:
    """Write metrics.json ({metrics, counts, info}), predictions.jsonl and report.md into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"metrics": out / "metrics.json", "predictions": out / "predictions.jsonl", "report": out / "report.md"}
    doc = {"metrics": result.metrics, "counts": result.counts, "info": result.info}
    paths["metrics"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    with paths["predictions"].open("w", encoding="utf-8") as f:
        for row in result.predictions:
            f.write(json.dumps(row, default=str) + "\n")
    report = format_report(result.metrics, result.counts, result.info, result.predictions)
    paths["report"].write_text(report, encoding="utf-8")
    return paths
