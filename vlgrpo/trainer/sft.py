"""SFT cold start: render each sample's gold answer in the target format and train on it teacher-forced.

Same data pipeline, prompts, feature injection and backends as GRPO (the R1 recipe: SFT fixes the format, RL
improves the answers). The loss is the mean negative log-likelihood over all completion tokens of the batch.
"""

from __future__ import annotations

from vlgrpo.policy.prompt import continue_turn
from vlgrpo.rewards.render import render_completion
from vlgrpo.types import Completion, RolloutGroup, Sample


def render_target(sample: Sample, answer_format: str, box_format: str, geometry=None) -> str:
    """The completion SFT teaches: `meta.sft_target` when the dataset provides one, else the rendered gold."""
    if sample.meta.get("sft_target"):
        return str(sample.meta["sft_target"])
    return render_completion(sample, answer_format, box_format, geometry)


def gold_group(state, sample: Sample) -> RolloutGroup:
    """The gold answer, rendered in the target format and tokenised (+ EOS), as a one-completion group of the run's
    `state` (what follows the prompt's opened `<think>`, when its template opened one)."""
    text = render_target(sample, state.cfg.data.answer_format, state.reward_ctx.box_format, state.geometry)
    prompt = state.rows.prompt(sample)
    written = continue_turn(prompt.opened, text, f"sample '{sample.id}': ")
    ids = state.tokenizer(written, add_special_tokens=False)["input_ids"] + [state.tokenizer.eos_token_id]
    return RolloutGroup(
        sample=sample,
        prompt_ids=prompt.input_ids,
        completions=[Completion(token_ids=ids, text=prompt.opened + written, finish_reason="stop")],
    )
