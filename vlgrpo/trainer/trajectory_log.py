"""Sample trajectories of a run with tools (rollout.tools), written where a user can read them: every
`logging.trajectories_every` steps, rank 0 writes up to `TRAJECTORIES` completions that called a tool to
`<run>/trajectories/step_<n>.jsonl` (the Hugging Face chat format, as `vlgrpo eval` writes them) with their crops in
`<run>/trajectories/step_<n>/`. Best effort: a write that fails is a warning, never the run's end.
"""

from __future__ import annotations

import json

from vlgrpo.rollout.turns import crop_names, trajectory_messages
from vlgrpo.trainer.ranks import rank_world
from vlgrpo.types import RolloutGroup

TRAJECTORIES = 4
"""Trajectories written per logged step."""


def log_trajectories(state, groups: list[RolloutGroup], rewards: list[float]) -> None:
    """This step's first TRAJECTORIES completions with a tool call and their rewards, when the step is due."""
    every, step = state.cfg.logging.trajectories_every, state.step + 1
    if not state.cfg.rollout.tools or not every or step % every or rank_world()[0] != 0:
        return
    rows = [(g.sample, c) for g in groups for c in g.completions]  # in the order of `rewards`
    picked = [(s, c, r) for (s, c), r in zip(rows, rewards) if c.turns][:TRAJECTORIES]
    folder = state.run_dir / "trajectories"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for sample, c, reward in picked:
            names = crop_names(sample, c, f"step_{step}")
            for name, data in zip(names, c.images):
                (folder / name).parent.mkdir(exist_ok=True)
                (folder / name).write_bytes(data)
            row = {"step": step, "sample_id": sample.id, "reward": reward, "finish_reason": c.finish_reason}
            lines.append(json.dumps({**row, "messages": trajectory_messages(sample, c, names)}) + "\n")
        (folder / f"step_{step}.jsonl").write_text("".join(lines))
    except OSError as e:
        state.log_warning(f"could not write the sample trajectories of step {step} to {folder}: {e}")
