"""SFT cold start: render each sample's gold answer in the target format and train on it teacher-forced.

Same data pipeline, prompts, feature injection and backends as GRPO (the R1 recipe: SFT fixes the format, RL
improves the answers). The loss is the mean negative log-likelihood over all completion tokens of the batch. A run
with tools (`rollout.tools`) trains on gold trajectories instead where a tool offers a gold call on a sample (the zoom
tool: on its box): the call, the tool's response turn (out of the loss, as in GRPO), then the gold answer.
"""

from __future__ import annotations

import json

from vlgrpo.data.images import load_image
from vlgrpo.policy.prompt import continue_turn
from vlgrpo.rewards.render import render_completion
from vlgrpo.rollout.tools.calls import first_tool_call
from vlgrpo.rollout.tools.context import Tool, ToolContext
from vlgrpo.rollout.tools.table import run_tool, tools_of
from vlgrpo.rollout.turns import png_bytes, response_turn, tool_message, tool_response_role
from vlgrpo.types import Completion, RolloutGroup, Sample


def render_target(sample: Sample, answer_format: str, box_format: str, geometry=None) -> str:
    """The completion SFT teaches: `meta.sft_target` when the dataset provides one, else the rendered gold."""
    if sample.meta.get("sft_target"):
        return str(sample.meta["sft_target"])
    return render_completion(sample, answer_format, box_format, geometry)


def gold_group(state, sample: Sample) -> RolloutGroup:
    """The gold answer, rendered in the target format and tokenised (+ EOS), as a one-completion group of the run's
    `state` (what follows the prompt's opened `<think>`, when its template opened one); a gold trajectory
    (`gold_trajectory`) when one of the run's tools offers a gold call on the sample (`gold_call`)."""
    text = render_target(sample, state.cfg.data.answer_format, state.reward_ctx.box_format, state.geometry)
    prompt = state.rows.prompt(sample)
    gold = gold_call(state, sample)
    if gold is not None:
        completion = gold_trajectory(state, sample, prompt, text, *gold)
    else:
        written = continue_turn(prompt.opened, text, f"sample '{sample.id}': ")
        ids = state.tokenizer(written, add_special_tokens=False)["input_ids"] + [state.tokenizer.eos_token_id]
        completion = Completion(token_ids=ids, text=prompt.opened + written, finish_reason="stop")
    return RolloutGroup(sample=sample, prompt_ids=prompt.input_ids, completions=[completion])


def gold_call(state, sample: Sample) -> tuple[Tool, dict, ToolContext] | None:
    """The first of the run's tools (rollout.tools) that offers a call on `sample` (`Tool.gold_call`: the zoom tool's
    on its box): the tool, the call's arguments and the context it runs in, as a rollout's (the sample's images);
    None when none does, or the sample has no image."""
    tools = [t for t in tools_of(state.cfg.rollout.tools) if t.gold is not None]
    if not tools or not sample.images:
        return None
    context = ToolContext([load_image(i) for i in sample.images], state.reward_ctx.box_format, state.geometry)
    for tool in tools:
        arguments = tool.gold_call(sample, context)
        if arguments is not None:
            return tool, arguments, context
    return None


def gold_trajectory(
    state, sample: Sample, prompt, answer: str, tool: Tool, arguments: dict, context: ToolContext
) -> Completion:
    """turn 1: `<think>` the tool's gold thought `</think>` (think_answer) and the tool's gold call; the tool's own
    result of it as the tool-response turn (tool_mask 1, so out of the loss); turn 2: `answer` and EOS. The result is
    the one a rollout's call with these arguments gets."""
    tok = state.tokenizer
    call = {"name": tool.name, "arguments": arguments}
    think = f"<think>{tool.gold_thought}</think>" if state.cfg.data.answer_format == "think_answer" else ""
    first = continue_turn(prompt.opened, f"{think}<tool_call>{json.dumps(call)}</tool_call>", f"sample '{sample.id}': ")
    result = run_tool(first_tool_call(first), context, tuple(state.cfg.rollout.tools))  # as a rollout runs it
    if result.error is not None:
        raise ValueError(f"sample '{sample.id}': the gold call of {tool.name} on {arguments} failed: {result.error}")
    turn = response_turn(result, context.geometry, tok, prompt.opening)  # as a rollout's tool response ends
    second = continue_turn(prompt.opened, answer, f"sample '{sample.id}': ")
    head = tok(first, add_special_tokens=False)["input_ids"]
    tail = tok(second, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    words = [{"type": "text", "text": turn.words}] if turn.words else []  # a tool's text, as a rollout's turn has it
    return Completion(
        token_ids=head + turn.ids + tail,
        text=prompt.opened + first + prompt.opened + second,
        finish_reason="stop",
        tool_mask=[0] * len(head) + [1] * len(turn.ids) + [0] * len(tail),
        images=[png_bytes(i) for i in turn.images],
        prompt_messages=list(prompt.messages),
        turns=[  # as a rollout writes them (`rollout/turns.py`): what the template renders back to token_ids
            {"role": "assistant", "content": [{"type": "text", "text": prompt.opening + first}]},
            tool_message(
                tool_response_role(state.lm.processor),
                [*({"type": "image", "image": k} for k in range(len(turn.images))), *words],
            ),
            {"role": "assistant", "content": [{"type": "text", "text": prompt.opening + second}]},
        ],
    )
