"""Eval outputs: `metrics.json` (metrics, sample counts, settings), `predictions.jsonl` (one row per sample),
`report.md` (a markdown table per suite, a few example answers) and, when POPE ran, `pope_vlmevalkit.tsv` (the
predictions in the table VLMEvalKit's POPE evaluation reads, to check our numbers with its scorer).

Formatting only: reads the metrics / counts / predictions an eval produced; knows nothing of models or scoring.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from vlgrpo.evals.suite import EvalResult
from vlgrpo.evals.trajectories import trajectory_lines
from vlgrpo.registry import EVAL_SUITE
from vlgrpo.rewards.extract import strip_answer_tags

EXAMPLES = 3
"""Example answers shown per suite in report.md."""


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    text = str(value).replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= 120 else text[:117] + "..."


def table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table (floats to 4 places, long text cut)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]


def groups(counts: dict[str, int], suite: str) -> list[str]:
    """The suite's sub-groups in the order they were counted (answer types, task_<task>, POPE splits)."""
    return [k[len(suite) + 1 :] for k in counts if k.startswith(f"{suite}/")]


def label(group: str) -> str:
    return f"task {group[len('task_') :]}" if group.startswith("task_") else group


def _examples(predictions: list[dict], suite: str) -> list[str]:
    rows = [
        [p["id"], p["question"], p["gold"], p["completion"], p.get("correct", p.get("iou"))]
        for p in predictions
        if p["suite"] == suite
    ][:EXAMPLES]
    return ["", f"Examples ({suite}):", "", *table(["id", "question", "gold", "completion", "score"], rows)]


def format_report(metrics: dict[str, float], counts: dict[str, int], info: dict, predictions: list[dict]) -> str:
    """The markdown report: settings, then one table per suite that ran (+ a few example answers)."""
    settings = [[k, v] for k, v in info.items() if k not in ("suites", "vision_cache") and v is not None]
    lines = ["# Evaluation report", "", *table(["setting", "value"], settings)]
    for suite in info.get("suites", []):  # each suite writes its own section (evals/suite.py)
        lines += ["", *EVAL_SUITE.load(suite).report(metrics, counts, info), *_examples(predictions, suite)]
    lines += trajectory_lines(predictions)
    return "\n".join(lines) + "\n"


def write_outputs(result: EvalResult, out_dir: str | Path) -> dict[str, Path]:
    """Write metrics.json ({metrics, counts, info}), predictions.jsonl and report.md into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"metrics": out / "metrics.json", "predictions": out / "predictions.jsonl", "report": out / "report.md"}
    doc = {"metrics": result.metrics, "counts": result.counts, "info": result.info}
    paths["metrics"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    for name, data in result.files.items():  # the tools' crops, which the rows' messages name
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    with paths["predictions"].open("w", encoding="utf-8") as f:
        for row in result.predictions:
            f.write(json.dumps(row, default=str) + "\n")
    report = format_report(result.metrics, result.counts, result.info, result.predictions)
    paths["report"].write_text(report, encoding="utf-8")
    pope = [row for row in result.predictions if row["suite"] == "pope"]
    if pope:
        paths["vlmevalkit"] = write_vlmevalkit_pope(pope, out / "pope_vlmevalkit.tsv")
    return paths


VLMEVALKIT_COLUMNS = ("index", "question", "answer", "category", "prediction", "completion")


def write_vlmevalkit_pope(rows: list[dict], path: Path) -> Path:
    """POPE predictions as the table VLMEvalKit's `ImageYORNDataset.evaluate` loads (vlmeval/dataset/image_yorn.py:
    `index`, `prediction`, `answer` as Yes/No; `POPE_rating` in vlmeval/dataset/utils/yorn.py groups by
    `category`, our split). `prediction` is the answer block when the completion has one (all our parsers read
    that; VLMEvalKit's reads the cell as given), `completion` the full text. Its exact-matching scorer on this file
    gives, per category, our `--parser vlmevalkit` metrics; its "Overall" pools the splits where ours averages
    them. Tab-separated, csv-quoted (pandas reads it with `sep="\t"`)."""
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(VLMEVALKIT_COLUMNS)
        for i, row in enumerate(rows):
            writer.writerow(
                [
                    i,
                    row["question"],
                    str(row["gold"]).capitalize(),
                    row["split"],
                    strip_answer_tags(row["completion"]),
                    row["completion"],
                ]
            )
    return path
