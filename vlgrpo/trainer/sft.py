"""SFT cold start: render each sample's gold answer in the target format and train on it teacher-forced.

Same data pipeline, prompts, feature injection and backends as GRPO (the R1 recipe: SFT fixes the format, RL
improves the answers). The loss is the mean negative log-likelihood over all completion tokens of the batch. A run
with the zoom tool (`rollout.tools: [zoom_in]`) trains on gold trajectories instead where a sample has a box: a call
zooming into the box's region, the crop's tool-response turn (out of the loss, as in GRPO), then the gold answer.
"""

from __future__ import annotations

import json

from vlgrpo.data.images import load_image
from vlgrpo.policy.prompt import continue_turn
from vlgrpo.rewards.boxes import from_original_pixels
from vlgrpo.rewards.render import render_completion
from vlgrpo.rollout.tools import ToolContext, first_tool_call, run_tool, tool_table
from vlgrpo.rollout.turns import png_bytes, response_turn
from vlgrpo.types import Completion, RolloutGroup, Sample

ZOOM_CONTEXT = 0.25
"""The share of the image's shorter side a gold trajectory's zoom box spans at least, around the sample's box: the
crop keeps some context around a small target (the synth `zoom` kind's 7 px shape in 448 px: a 112 px crop)."""
ZOOM_THOUGHT = "I zoom in to see it better."


def render_target(sample: Sample, answer_format: str, box_format: str, geometry=None) -> str:
    """The completion SFT teaches: `meta.sft_target` when the dataset provides one, else the rendered gold."""
    if sample.meta.get("sft_target"):
        return str(sample.meta["sft_target"])
    return render_completion(sample, answer_format, box_format, geometry)


def gold_group(state, sample: Sample) -> RolloutGroup:
    """The gold answer, rendered in the target format and tokenised (+ EOS), as a one-completion group of the run's
    `state` (what follows the prompt's opened `<think>`, when its template opened one); a gold trajectory
    (`gold_trajectory`) when the run has the zoom tool and the sample a box."""
    text = render_target(sample, state.cfg.data.answer_format, state.reward_ctx.box_format, state.geometry)
    prompt = state.rows.prompt(sample)
    if "zoom_in" in tool_table(tuple(state.cfg.rollout.tools)) and sample.boxes and sample.images:
        completion = gold_trajectory(state, sample, prompt, text)
    else:
        written = continue_turn(prompt.opened, text, f"sample '{sample.id}': ")
        ids = state.tokenizer(written, add_special_tokens=False)["input_ids"] + [state.tokenizer.eos_token_id]
        completion = Completion(token_ids=ids, text=prompt.opened + written, finish_reason="stop")
    return RolloutGroup(sample=sample, prompt_ids=prompt.input_ids, completions=[completion])


def zoom_region(box, image_size: tuple[int, int], context: float = ZOOM_CONTEXT) -> tuple[float, ...]:
    """`box` (original pixels) grown about its centre to at least `context` x the image's shorter side per side,
    kept inside the image."""
    (x1, y1, x2, y2), (w, h) = box, image_size
    side = context * min(w, h)
    out = []
    for lo, hi, limit in ((x1, x2, w), (y1, y2, h)):
        span = max(hi - lo, min(side, limit))
        start = min(max((lo + hi) / 2 - span / 2, 0), limit - span)
        out.append((start, start + span))
    return (out[0][0], out[1][0], out[0][1], out[1][1])


def gold_trajectory(state, sample: Sample, prompt, answer: str) -> Completion:
    """turn 1: `<think>ZOOM_THOUGHT</think>` (think_answer) and a zoom-in call on the sample's first box grown by
    `zoom_region`, in the model's box convention; the tool's own crop of it as the tool-response turn (tool_mask 1,
    so out of the loss); turn 2: `answer` and EOS. The crop is the one a rollout's call on that box returns."""
    fmt, geometry, tok = state.reward_ctx.box_format, state.geometry, state.tokenizer
    image = load_image(sample.images[0])
    size = (image.width, image.height)
    region = from_original_pixels([zoom_region(sample.boxes[0], size)], fmt, size, geometry)[0]
    name = tool_table(("zoom_in",))["zoom_in"].name
    call = {"name": name, "arguments": {"bbox_2d": [int(round(v)) for v in region]}}
    think = f"<think>{ZOOM_THOUGHT}</think>" if state.cfg.data.answer_format == "think_answer" else ""
    first = continue_turn(prompt.opened, f"{think}<tool_call>{json.dumps(call)}</tool_call>", f"sample '{sample.id}': ")
    result = run_tool(first_tool_call(first), ToolContext([image], fmt, geometry), ("zoom_in",))  # as a rollout runs it
    if result.error is not None:
        raise ValueError(f"sample '{sample.id}': the gold zoom on {call['arguments']} failed: {result.error}")
    turn = response_turn(result, geometry, tok, prompt.opened)
    second = continue_turn(prompt.opened, answer, f"sample '{sample.id}': ")
    head = tok(first, add_special_tokens=False)["input_ids"]
    tail = tok(second, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return Completion(
        token_ids=head + turn.ids + tail,
        text=prompt.opened + first + prompt.opened + second,
        finish_reason="stop",
        tool_mask=[0] * len(head) + [1] * len(turn.ids) + [0] * len(tail),
        images=[png_bytes(i) for i in turn.images],
        turns=[
            {"role": "assistant", "content": [{"type": "text", "text": prompt.opened + first}]},
            {"role": "tool", "content": [{"type": "image", "image": k} for k in range(len(turn.images))]},
            {"role": "assistant", "content": [{"type": "text", "text": prompt.opened + second}]},
        ],
    )
