"""SFT cold start: render each sample's gold answer in the target format and train on it teacher-forced.

Same data pipeline, prompts, feature injection and backends as GRPO (the R1 recipe: SFT fixes the format, RL
improves the answers). The loss is the mean negative log-likelihood over all completion tokens of the batch.
"""

from __future__ import annotations

from vlgrpo.rewards.render import render_completion
from vlgrpo.types import Sample


def render_target(sample: Sample, answer_format: str, box_format: str, geometry=None) -> str:
    """The completion SFT teaches: `meta.sft_target` when the dataset provides one, else the rendered gold."""
    if sample.meta.get("sft_target"):
        return str(sample.meta["sft_target"])
    return render_completion(sample, answer_format, box_format, geometry)
