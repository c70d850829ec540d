"""Trajectories you can read: a multi-turn completion's conversation on its prediction row, in the Hugging Face chat
format (`messages`: roles, text parts, `{"type": "image", "image": "<file>"}` parts; the processor's chat template
renders them back to the ids the model was fed, `rollout.turns.trajectory_messages`), the crops its tools returned
saved as files next to predictions.jsonl, and a few of them in report.md. Knows nothing of models or engines.
"""

from __future__ import annotations

from vlgrpo.evals.suite import EvalResult
from vlgrpo.rollout.turns import crop_names, trajectory_messages
from vlgrpo.types import Completion, Sample

CROPS = "crops"
"""The folder (in the eval's output directory) that holds the tools' images."""
SHOWN = 3
"""Trajectories report.md shows."""


def messages_of(s: Sample, c: Completion, files: dict[str, bytes]) -> list[dict]:
    """The row's conversation, each crop added to `files` under `crops/<id>_<k>.png`, the name its part gives."""
    names = crop_names(s, c, CROPS)
    files.update(zip(names, c.images))
    return trajectory_messages(s, c, names)


def add_trajectories(result: EvalResult, suites: dict[str, list[Sample]], completions: list[Completion]) -> None:
    """`messages` on the prediction row of every multi-turn completion (in `suites` order, as decoded); the crops
    go to `result.files`."""
    rows = {(row["suite"], row["id"]): row for row in result.predictions}
    start = 0
    for name, group in suites.items():
        for s, c in zip(group, completions[start : start + len(group)]):
            row = rows.get((name, s.id))
            if c.turns and row is not None:
                row["messages"] = messages_of(s, c, result.files)
        start += len(group)


def trajectory_lines(predictions: list[dict], shown: int = SHOWN) -> list[str]:
    """report.md's section: the first `shown` rows with a tool call, turn by turn, crops as images."""
    rows = [r for r in predictions if r.get("messages")][:shown]
    if not rows:
        return []
    lines = ["", "## Trajectories with tool calls", ""]
    for row in rows:
        lines += [f"**{row['suite']} / {row['id']}**", ""]
        for m in row["messages"]:
            if m["role"] == "system":  # the same tools block on every row
                continue
            parts = [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"]
            for p in parts:
                if p["type"] == "image":
                    lines.append(
                        f"- {m['role']}: ![image]({p['image']})"
                        if p["image"].startswith(CROPS)
                        else f"- {m['role']}: image {p['image']}"
                    )
                else:
                    lines.append(f"- {m['role']}: `{p['text'].strip()[:300]}`")
        lines.append("")
    return lines
