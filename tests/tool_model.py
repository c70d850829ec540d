"""A tiny checkpoint taught to call the zoom-in tool: teacher-forced on the tool prompts of a few samples to write a
call first (the engines' greedy trajectories then take several turns, the crops coming back as images). The tests of
multi-turn decoding compare engines on it; a random tiny model never writes a well-formed call."""

from __future__ import annotations

import torch

from vlgrpo.policy.forward import collate_groups, completion_logprobs
from vlgrpo.policy.prompt import IMAGE_PAD, build_prompt, forbidden_mask, vocab_size
from vlgrpo.rollout.sampling import Row
from vlgrpo.rollout.tools.table import tool_schemas
from vlgrpo.types import Completion, RolloutGroup
from vlgrpo.vision_cache import VisionCache

CALL = '<tool_call>{{"name": "image_zoom_in_tool", "arguments": {{"bbox_2d": [{}, {}, {}, {}]}}}}</tool_call>'


def teach_tool_call(model, processor, samples, box=(0, 0, 56, 56), steps: int = 40, lr: float = 1e-2) -> list[float]:
    """Train `model`'s language weights in place (Adam, the whole batch each step) to answer each sample's tool prompt
    (`rollout.tools=[zoom_in]`, the default prompt settings) with a zoom-in call on `box` -> the losses per step."""
    from vlgrpo.data.images import ProcessorGeometry

    geometry = ProcessorGeometry.from_processor(processor)
    tools = tool_schemas(("zoom_in",))
    prompts = [build_prompt(s, processor, geometry, tools=tools) for s in samples]
    tok = processor.tokenizer
    ids = tok(CALL.format(*box), add_special_tokens=False)["input_ids"]
    groups = [RolloutGroup(s, p.input_ids, [Completion(list(ids), "", "stop")]) for s, p in zip(samples, prompts)]
    batch = collate_groups(groups, tok.pad_token_id, tok.convert_tokens_to_ids(IMAGE_PAD))
    feats = VisionCache(model, processor).get_rows([p.sources for p in prompts])
    forbidden = forbidden_mask(tok, vocab_size(model))
    params = [p for n, p in model.named_parameters() if "visual" not in n]
    opt = torch.optim.Adam(params, lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        logp = completion_logprobs(model, batch, feats, forbidden)
        loss = -(logp * batch.completion_mask).sum() / batch.completion_mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def scripted(tokenizer, turns: list[list[str]]):
    """An HF engine `decode`: its k-th call writes turns[k % len(turns)], the texts cycled over the call's rows."""

    def decode(model, last, cache, next_pos, mask, run):
        texts = turns[decode.calls % len(turns)]
        decode.calls += 1
        rows = []
        for r in range(last.shape[0] * run.params.completions_per_prompt):
            ids = tokenizer(texts[r % len(texts)], add_special_tokens=False)["input_ids"]
            rows.append(Row(list(ids), [-0.1] * len(ids), "stop"))
        return rows

    decode.calls = 0
    return decode
