"""The forward passes with injected vision features: the pixel path's logits, and the shared-prefix log-prob pass
(packed or transformers) against whole rows."""

import pytest
import torch
from exact_delta_rule import use_exact_rule

from vlgrpo.data.images import load_image
from vlgrpo.data.prompts import render_messages
from vlgrpo.policy import forward as forward_module
from vlgrpo.policy import prefill as prefill_module
from vlgrpo.policy.forward import (
    CompletionBatch,
    collate_groups,
    completion_logits,
    completion_logprobs_and_entropy,
    policy_logits,
)
from vlgrpo.policy.prompt import build_prompt, forbidden_mask
from vlgrpo.types import Completion, RolloutGroup
from vlgrpo.vision_cache import VisionCache

ARCHS = ["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_5"]


def _pixel_batch(processor, samples, completions):
    """The reference pixel path: processor(text, images) for each row, completions appended, left-padded."""
    texts = [
        processor.apply_chat_template(render_messages(s), add_generation_prompt=True, tokenize=False) for s in samples
    ]
    inputs = processor(text=texts, images=[load_image(s.image) for s in samples], return_tensors="pt", padding=True)
    comp = torch.tensor(completions)
    inputs["input_ids"] = torch.cat([inputs["input_ids"], comp], 1)
    inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(comp)], 1)
    inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(comp)], 1)
    return inputs


@pytest.mark.parametrize("arch", ARCHS)
def test_injected_features_give_the_pixel_path_logits(load, samples, arch):
    model, processor = load(arch)
    batch_samples = [samples[0], samples[5]]  # prompts of different lengths -> left padding
    completions = [[88, 212, 344, 5], [212, 4, 295, 2]]
    ref_inputs = _pixel_batch(processor, batch_samples, completions)
    assert ref_inputs["attention_mask"][:, 0].tolist().count(0) == 1  # one row really is padded
    with torch.no_grad():
        ref = model(**ref_inputs).logits
        feats = VisionCache(model, processor).get([s.image for s in batch_samples])
        # stale state on purpose: generate leaves rope_deltas of another batch behind
        model.generate(**_pixel_batch(processor, [samples[1]], [[7]]), max_new_tokens=2, do_sample=False)
        args = (ref_inputs["input_ids"], ref_inputs["attention_mask"], ref_inputs["mm_token_type_ids"], feats)
        got = policy_logits(model, *args)
        again = policy_logits(model, *args)  # the same features list used twice: a fresh dict per call
    real = ref_inputs["attention_mask"].bool()
    assert (got - ref)[real].abs().max() <= 1e-5
    assert torch.equal(got, again)
    # the pitfall this avoids: without mm_token_type_ids Qwen2.5-VL silently uses other M-RoPE positions
    if arch == "qwen2_5_vl":
        kw = {k: v for k, v in ref_inputs.items() if k not in ("mm_token_type_ids", "pixel_values")}
        with torch.no_grad():
            model.model.rope_deltas = None
            wrong = model(**kw, mm_encoder_outputs={"image": _pooled(feats)}).logits
        assert (wrong - ref)[real].abs().max() > 1e-3


def _pooled(feats):
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    return BaseModelOutputWithPooling(pooler_output=[f.embeds for f in feats])


def _groups(samples, processor, completions_per_prompt):
    groups = []
    for s, comps in zip(samples, completions_per_prompt):
        p = build_prompt(s, processor)
        groups.append(RolloutGroup(s, p.input_ids, [Completion(c, "", "length") for c in comps]))
    return groups


RAGGED = [[[25, 26, 27], [28, 29]], [[30], [31, 32, 33, 34], [35, 36]]]
EVEN = [[[25, 26, 27], [28, 29, 30]], [[31, 32, 33], [34, 35, 36], [37, 38, 39]]]
GROUPS = [[[25, 26, 27], [28, 29]], [[30, 31, 32, 33], [34]], [[35, 36], [37, 38, 39]]]
LAYOUT = {  # rows: (completion tokens [R, C], row_prompt, each row's length)
    "ragged": ((5, 4), [0, 0, 1, 1, 1], [3, 2, 1, 4, 2]),
    "even": ((5, 3), [0, 0, 1, 1, 1], [3] * 5),
    "groups": ((6, 4), [0, 0, 1, 1, 2, 2], [3, 2, 4, 1, 2, 3]),
}


@pytest.mark.parametrize("rows", [RAGGED, EVEN, GROUPS], ids=["ragged", "even", "groups"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "transformers"])
@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prefix_logits_and_grads_equal_whole_rows(load, samples, arch, packed, rows, monkeypatch):
    """The packed completion pass (no layer on padding) and the transformers one over the gathered cache (whole rows
    for Qwen3.5, whose linear-attention cache has no per-row select) both give the pixel path's logits and gradients,
    with a left-padded prompt and rows of 1 to 4 tokens (ragged), or rows of one length (even: the packed pass's
    layout is the padded one, viewed, not scattered), or groups of one size (groups: each prompt's keys and values
    broadcast to its rows inside the concatenation, not gathered per row)."""
    model, processor = load(arch)
    assert forward_module.supports_text_decoder(model)
    if arch == "qwen3_5":  # the float32 chunked rule's own error on a whole row exceeds the tolerance (see the module)
        use_exact_rule(monkeypatch)
    if not packed:
        monkeypatch.setattr(forward_module, "supports_text_decoder", lambda m: False)
    groups = _groups(samples[: len(rows)], processor, rows)
    feats = VisionCache(model, processor).get([g.sample.image for g in groups])
    tok = processor.tokenizer
    batch = collate_groups(groups, tok.pad_token_id, model.config.image_token_id)
    shape, row_prompt, lengths = LAYOUT["ragged" if rows is RAGGED else "even" if rows is EVEN else "groups"]
    assert batch.completion_ids.shape == shape
    assert batch.row_prompt.tolist() == row_prompt
    assert batch.completion_mask.sum(1).tolist() == lengths
    assert (batch.prompt_mask == 0).any()  # the prompts differ in length: one is left-padded

    # whole rows, the pixel path: prompt + completion, one row per completion
    rows = [(g.sample, c.token_ids) for g in groups for c in g.completions]
    ref = []
    for s, comp in rows:
        inputs = _pixel_batch(processor, [s], [comp])
        ref.append(model(**inputs).logits[0, -len(comp) - 1 : -1])
    ref_loss = sum((r * torch.linspace(0, 1, r.shape[-1])).sum() for r in ref)
    ref_loss.backward()

    def lm_grads():  # the cached features are detached: the language model's gradients
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None and "visual" not in n}

    ref_grads = lm_grads()
    assert any("embed_tokens" in n for n in ref_grads) and any("mlp" in n for n in ref_grads)
    model.zero_grad(set_to_none=True)

    logits = completion_logits(model, batch, feats)  # [R, C, V]
    loss = 0
    for r, (_, comp) in enumerate(rows):
        assert (logits[r, : len(comp)] - ref[r]).abs().max() <= 1e-5
        loss = loss + (logits[r, : len(comp)] * torch.linspace(0, 1, logits.shape[-1])).sum()
    loss.backward()
    grads = lm_grads()
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        scale = float(ref_grads[name].abs().max())  # float32 rounding, relative to the tensor's largest entry
        assert (g - ref_grads[name]).abs().max() <= 1e-5 + 2e-6 * scale, name
    model.zero_grad(set_to_none=True)

    # a micro-batch of rows keeps only the prompts it needs
    sub = batch.select([3, 1])
    assert sub.row_prompt.tolist() == [1, 0] and batch.used_prompts([3, 1]) == [0, 1]
    pick = [2, 3] if len(groups) == 3 else [2, 4]  # two rows of prompt 1
    sub2 = batch.select(pick)
    assert isinstance(sub2, CompletionBatch) and sub2.prompt_ids.shape[0] == 1
    with torch.no_grad():
        part = completion_logits(model, sub2, [feats[i] for i in batch.used_prompts(pick)])
        full = completion_logits(model, batch, feats)
    assert (part - full[pick]).abs().max() <= 1e-5


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_gradient_checkpointing_falls_back_to_whole_rows(load, samples, arch):
    model, processor = load(arch)
    groups = _groups(samples[:1], processor, [[[25, 26, 27], [28, 29, 3]]])
    feats = VisionCache(model, processor).get([groups[0].sample.image])
    tok = processor.tokenizer
    batch = collate_groups(groups, tok.pad_token_id, model.config.image_token_id)
    forbidden = forbidden_mask(tok, model.config.text_config.vocab_size)
    with torch.no_grad():
        ref, ref_ent = completion_logprobs_and_entropy(model, batch, feats, forbidden, 0.7)
    model.gradient_checkpointing_enable()
    model.train()
    try:
        logp, ent = completion_logprobs_and_entropy(model, batch, feats, forbidden, 0.7)
        logp.sum().backward()
    finally:
        model.gradient_checkpointing_disable()
        model.eval()
    assert (logp - ref).abs().max() <= 1e-5 and (ent - ref_ent).abs().max() <= 1e-5
    assert model.lm_head.weight.grad is not None
    model.zero_grad(set_to_none=True)
    # temperature and the placeholder mask: logp = log softmax(logits / 0.7) with placeholders at -inf
    with torch.no_grad():
        x = completion_logits(model, batch, feats)[0, 0] / 0.7
    x[forbidden] = -torch.inf
    assert torch.isclose(ref[0, 0], torch.log_softmax(x, -1)[25], atol=1e-6)


def _tool_batch(model, processor, samples, short_schema: bool):
    """Two prompts' tool trajectories (per prompt a row that calls twice, a row that answers at once), scripted on the
    HF engine -> (the trainer's batch with its crops, the prompts' features, the forbidden mask). `short_schema`: a
    one-line tool schema instead of the zoom tool's ~750-token one."""
    from tool_model import CALL, scripted

    from vlgrpo.rollout.base import SamplingParams
    from vlgrpo.rollout.hf import HFEngine
    from vlgrpo.rollout.turns import ToolRollout
    from vlgrpo.trainer.batch import attach_crops, make_batch

    tok = processor.tokenizer
    turns = [[CALL.format(0, 0, 56, 56), "<answer>3</answer>"], [CALL.format(28, 28, 84, 70)], ["<answer>2</answer>"]]
    cache = VisionCache(model, processor)
    engine = HFEngine(model, processor, cache, box_format="plain", decode=scripted(tok, turns))
    rollout = ToolRollout(engine, ("zoom_in",), 3)
    if short_schema:
        rollout.schemas = [{"type": "function", "function": {"name": "image_zoom_in_tool"}}]
    groups = rollout.generate(samples[:2], SamplingParams(max_new_tokens=64, completions_per_prompt=2))
    assert [len(c.images) for g in groups for c in g.completions] == [2, 0, 2, 0]
    feats = cache.get_rows([p.sources for p in engine.build_prompts(samples[:2])])
    forbidden = forbidden_mask(tok, model.config.get_text_config().vocab_size)
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    batch = make_batch(groups, feats, tok.pad_token_id, image_id, torch.nonzero(forbidden).flatten().tolist())
    attach_crops(batch, groups, cache)
    return batch, feats, forbidden


def _logprobs_and_grads(model, batch, feats, forbidden, full: bool = False):
    """The masked log-probs [R, C] and every parameter's gradient of their sum (whole rows with `full`)."""
    from vlgrpo.grpo.logprobs import token_logprobs

    model.zero_grad()
    b = batch.batch
    if full:
        logits = forward_module._completion_logits_full_rows(model, b, feats)
        logp, _ = token_logprobs(logits, forward_module.scored_ids(b), forbidden=forbidden)
    else:
        logp, _ = completion_logprobs_and_entropy(model, b, feats, forbidden)
    (-(logp * batch.loss_mask).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), grads


def _assert_same(a, b, mask):
    (logp_a, grads_a), (logp_b, grads_b) = a, b
    assert float((logp_a - logp_b)[mask].abs().max()) <= 1e-5
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 10
    for name, g in grads_b.items():
        assert float((grads_a[name] - g).abs().max()) <= 1e-5 * max(1.0, float(g.abs().max())), name


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_tool_rows_in_the_shared_prefix_pass_equal_whole_rows(load, samples, arch, monkeypatch):
    """Trajectories with crops through the shared-prefix packed pass: the prompt prefilled once, each crop's
    embeddings at its pads, M-RoPE from the whole row's grids (a crop shifts the text after it), DeepStack at the
    crop's tokens (Qwen3-VL), each row's own Gated DeltaNet state (Qwen3.5). Log-probs and every parameter's gradient
    equal the whole-row forward's."""
    model, processor = load(arch, spread_by=0.1)
    if arch == "qwen3_5":  # the float32 chunked rule's own error on a whole row exceeds the tolerance (see the module)
        use_exact_rule(monkeypatch)
    batch, feats, forbidden = _tool_batch(model, processor, samples, short_schema=True)  # the exact rule loops over
    # tokens: short prompts
    packed = forward_module.packed_completion_logits
    calls = []  # the shared-prefix pass ran, given the crops (not the whole-row fallback)
    monkeypatch.setattr(
        forward_module, "packed_completion_logits", lambda *a: calls.append(a[-1].embeds.shape[0]) or packed(*a)
    )
    model.train()
    shared = _logprobs_and_grads(model, batch, feats, forbidden)
    b = batch.batch
    assert calls == [sum(f.embeds.shape[0] for extra in b.row_images for f in extra)] and calls[0] > 0
    whole = _logprobs_and_grads(model, batch, feats, forbidden, full=True)
    model.eval()
    _assert_same(shared, whole, batch.loss_mask.bool())


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_a_tools_block_every_prompt_shares_is_prefilled_once_for_the_batch(load, samples, arch, monkeypatch):
    """The zoom tool's prompts share their system turn and tools block (~750 tokens of the tiny tokenizer): the
    update forwards it once for the batch and each prompt's own tokens after it. Log-probs and gradients equal those
    of each prompt prefilled whole (SHARED_PREFIX_MIN out of reach) and of whole rows."""
    model, processor = load(arch, spread_by=0.1)
    batch, feats, forbidden = _tool_batch(model, processor, samples, short_schema=False)
    b = batch.batch
    shared_len = prefill_module.common_prefix(b.prompt_ids, b.prompt_mask, b.mm_token_type_ids)
    assert shared_len >= prefill_module.SHARED_PREFIX_MIN and shared_len < int(b.prompt_mask.sum(1).min())
    prefills = []
    real_prefill = prefill_module.prefill
    monkeypatch.setattr(
        prefill_module, "prefill", lambda m, ids, *a: prefills.append(ids.shape) or real_prefill(m, ids, *a)
    )
    model.train()
    once = _logprobs_and_grads(model, batch, feats, forbidden)
    assert prefills == []  # the shared path, not the plain prefill
    monkeypatch.setattr(prefill_module, "SHARED_PREFIX_MIN", 10**9)
    each = _logprobs_and_grads(model, batch, feats, forbidden)
    assert len(prefills) == 1 and prefills[0][0] == 2  # both prompts prefilled whole
    whole = _logprobs_and_grads(model, batch, feats, forbidden, full=True)
    model.eval()
    _assert_same(once, each, batch.loss_mask.bool())
    _assert_same(once, whole, batch.loss_mask.bool())
