"""Shared bits of the trainer tests: a tiny run config and a reward with variance on an untrained model."""

from __future__ import annotations

from pathlib import Path

from vlgrpo.config import Config, load_config

REWARD_MODULE = '''
def length(completion, **fields):
    """Longer completions score higher: gives every group reward variance even on a random policy."""
    return len(completion) / 10.0
'''


def write_reward_module(directory: Path) -> str:
    """A user reward file; returns its `file.py:function` spec for reward.recipe."""
    path = directory / "length_reward.py"
    path.write_text(REWARD_MODULE)
    return f"{path}:length"


def tiny_config(model_dir: str, data_dir: Path, run_dir: Path, *overrides: str) -> Config:
    base = [
        f"model.name_or_path={model_dir}",
        f"data.train={data_dir / 'train.jsonl'}",
        "data.answer_format=answer",
        "rollout.completions_per_prompt=4",
        "rollout.max_new_tokens=8",
        "train.prompts_per_step=2",
        "train.micro_batch_completions=4",
        "train.steps=2",
        "train.lr=1e-3",
        f"train.output_dir={run_dir}",
        "logging.progress_bar=false",
    ]
    return load_config(None, base + list(overrides))
