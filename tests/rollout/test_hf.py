import math
from functools import partial

import pytest
import torch

from vlgrpo.data.images import load_image
from vlgrpo.data.prompts import render_messages
from vlgrpo.models import placeholder_token_ids
from vlgrpo.policy.forward import collate_groups, completion_logprobs
from vlgrpo.policy.prompt import forbidden_mask
from vlgrpo.policy.text_decoder import Fused
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.decode import SharedPrefixDecoder
from vlgrpo.rollout.hf import HFEngine, decode_shared
from vlgrpo.rollout.sampling import sample_next
from vlgrpo.types import Sample
from vlgrpo.vision_cache import VisionCache


class ForcedLogits:
    """Hooks on the LM head (every forward's logits: the prefill's and each decode step's, whichever path decodes) and
    on the token embedding (the calls, as (rows, tokens)) that add `bonus` to chosen ids: forward k (k=0: prefill)
    favours seq[k]; `always` ids are favoured at every forward."""

    def __init__(self, model, seq=None, always=None, bonus=100.0):
        self.seq, self.always, self.bonus, self.calls = seq or [], always or [], bonus, []
        self.handles = [
            model.get_input_embeddings().register_forward_hook(self.count),
            model.get_output_embeddings().register_forward_hook(self),
        ]

    def count(self, module, args, out):
        ids = args[0]
        self.calls.append((ids.shape[0], ids.shape[1] if ids.dim() > 1 else 1))

    def __call__(self, module, args, out):
        k = len(self.calls) - 1
        if k < len(self.seq):
            out[..., self.seq[k]] += self.bonus
        for i in self.always:
            out[..., i] += self.bonus
        return out

    def remove(self):
        for h in self.handles:
            h.remove()


def _engine(model, processor, **kw):
    return HFEngine(model, processor, VisionCache(model, processor), **kw)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_5"])
def test_greedy_equals_transformers_generate_on_pixels(load, samples, arch):
    model, processor = load(arch, spread_by=0.1)
    engine = _engine(model, processor, batch_prompts=3)  # three prompts of different lengths in one left-padded batch
    batch = [samples[0], samples[5], samples[2]]
    groups = engine.generate(batch, SamplingParams(completions_per_prompt=2, temperature=0, max_new_tokens=10))
    bad = placeholder_token_ids(processor.tokenizer)
    for s, g in zip(batch, groups):
        text = processor.apply_chat_template(render_messages(s), add_generation_prompt=True, tokenize=False)
        inputs = processor(text=[text], images=[load_image(s.image)], return_tensors="pt")
        assert g.prompt_ids == inputs["input_ids"][0].tolist()
        out = model.generate(
            **inputs,
            max_new_tokens=10,
            do_sample=False,
            suppress_tokens=bad,
            output_scores=True,
            return_dict_in_generate=True,
        )
        ref = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
        assert len(set(ref)) > 3  # a varied sequence, not one repeated token
        for c in g.completions:
            assert c.token_ids == ref
            ref_lp = [torch.log_softmax(sc[0], -1)[t].item() for sc, t in zip(out.scores, ref)]
            assert max(abs(a - b) for a, b in zip(c.logprobs, ref_lp)) <= 1e-5
            opened = "<think>\n" if arch == "qwen3_5" else ""  # the turn the prompt opened leads the text
            assert c.finish_reason == "length" and c.text == opened + processor.tokenizer.decode(
                ref, skip_special_tokens=True
            )
    single = _engine(model, processor, batch_prompts=1)
    one_by_one = single.generate(batch, SamplingParams(temperature=0, max_new_tokens=10))
    assert [g.completions[0].token_ids for g in one_by_one] == [g.completions[0].token_ids for g in groups]


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_prefill_once_per_prompt_and_one_encoder_call_per_unique_image(load, samples, arch):
    model, processor = load(arch)
    engine = _engine(model, processor, batch_prompts=2)
    same_image = Sample(id="dup", question="Is there a red circle?", answer_type="yesno", image=samples[0].image)
    batch = [samples[0], samples[1], same_image]  # 3 prompts, 2 unique images, chunks of 2 + 1
    hook = ForcedLogits(model)
    try:
        groups = engine.generate(batch, SamplingParams(completions_per_prompt=4, max_new_tokens=5, seed=3))
    finally:
        hook.remove()
    prompt_lens = [len(g.prompt_ids) for g in groups]
    prefills = [shape for shape in hook.calls if shape[1] > 1]
    assert prefills == [(2, max(prompt_lens[:2])), (1, prompt_lens[2])]  # each prompt forwarded once, not G times
    assert len(hook.calls) == 2 + 4 + 4  # two prefills, then 4 one-token decode forwards per chunk
    s = engine.stats()
    assert s["rollout/prefill_tokens"] == sum(prompt_lens)
    assert (s["rollout/encoder_calls"], s["rollout/images_encoded"]) == (1, 2)
    assert s["rollout/completions"] == 12 and s["rollout/generated_tokens"] == 60
    assert s["rollout/decode_tokens"] == 2 * 4 * 4 + 1 * 4 * 4  # 4 decode forwards per chunk (5th token not fed)
    engine.reset_stats()
    engine.generate(batch[:2], SamplingParams(completions_per_prompt=2, max_new_tokens=2))
    assert engine.stats()["rollout/encoder_calls"] == 0  # cached across steps


def test_sampling_logprobs_equal_the_trainers_pass(load, samples):
    model, processor = load("qwen2_5_vl", spread_by=0.1)
    engine = _engine(model, processor, batch_prompts=2)
    params = SamplingParams(completions_per_prompt=3, temperature=0.7, top_p=0.9, top_k=50, max_new_tokens=8, seed=0)
    groups = engine.generate(samples[:3], params)
    feats = engine.cache.get([g.sample.image for g in groups])
    tok = processor.tokenizer
    batch = collate_groups(groups, tok.pad_token_id, model.config.image_token_id)
    forbidden = forbidden_mask(tok, model.config.text_config.vocab_size)
    with torch.no_grad():
        logp = completion_logprobs(model, batch, feats, forbidden, temperature=0.7)
    rows = [c for g in groups for c in g.completions]
    assert len({tuple(c.token_ids) for c in rows}) > 3  # really sampled
    for r, c in enumerate(rows):
        assert torch.allclose(logp[r, : len(c.token_ids)], torch.tensor(c.logprobs), atol=1e-5, rtol=0)
    again = engine.generate(samples[:3], params)
    assert [c.token_ids for g in again for c in g.completions] == [c.token_ids for c in rows]  # seeded
    other = engine.generate(
        samples[:3], SamplingParams(completions_per_prompt=3, temperature=0.7, max_new_tokens=8, seed=1)
    )
    assert [c.token_ids for g in other for c in g.completions] != [c.token_ids for c in rows]


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_5"])
def test_shared_prefix_decode_samples_what_the_transformers_forward_samples(load, samples, arch, monkeypatch):
    """The decode step that reads each prompt's KV once for its G rows against the transformers forward over a KV
    cache copied G ways: the same tokens and log-probs, with left padding and rows that stop at different steps, and
    prompts whose rows have all finished dropped from the decoder."""
    model, processor = load(arch, spread_by=0.1)
    assert SharedPrefixDecoder.supports(model)
    engine = _engine(model, processor, batch_prompts=3)
    eos = processor.tokenizer.eos_token_id
    batch = [samples[0], samples[5], samples[2]]  # different prompt lengths: a left-padded chunk
    params = SamplingParams(completions_per_prompt=4, temperature=1.0, max_new_tokens=12, seed=5)
    hook = ForcedLogits(model, always=[eos], bonus=5.0)  # eos likely enough that rows stop at different steps
    fused, product = [], Fused.product  # the decode's projections on its own copies (`text_decoder.fuse`)
    monkeypatch.setattr(Fused, "product", lambda self, h: fused.append(len(self.sizes)) or product(self, h))
    add_to = Fused.add_to  # o and down: the residual summed inside the product
    monkeypatch.setattr(Fused, "add_to", lambda self, x, h: fused.append(-len(self.sizes)) or add_to(self, x, h))
    joint, init = [], SharedPrefixDecoder.__init__  # q/k/v rotated as one tensor where nothing stands in between
    monkeypatch.setattr(SharedPrefixDecoder, "__init__", lambda self, *a: init(self, *a) or joint.append(self.joint))
    try:
        shared = engine.generate(batch, params)
        shared_calls = list(hook.calls)
        # every step's attention (q, k, v; o with the residual), MLP (gate, up; down with the residual) and Gated
        # DeltaNet input (qkv, z, b, a) ran fused
        assert set(fused) == ({-1, 2, 3, 4} if arch == "qwen3_5" else {-1, 2, 3})
        assert set(joint) == {arch in ("qwen2_vl", "qwen2_5_vl")}  # Qwen3: q/k norms, Qwen3.5: a gate in between
        monkeypatch.setattr(SharedPrefixDecoder, "supports", staticmethod(lambda m: False))
        reference = engine.generate(batch, params)
    finally:
        hook.remove()
    rows, ref_rows = [c for g in shared for c in g.completions], [c for g in reference for c in g.completions]
    assert len({len(c.token_ids) for c in rows}) > 2  # rows really stopped at different steps
    assert [c.token_ids for c in rows] == [c.token_ids for c in ref_rows]
    assert [c.finish_reason for c in rows] == [c.finish_reason for c in ref_rows]
    for c, r in zip(rows, ref_rows):
        assert max(abs(a - b) for a, b in zip(c.logprobs, r.logprobs)) <= 1e-5
    assert len(shared_calls) == 1 + max(len(c.token_ids) for c in rows) - 1  # prefill, then one step per new token
    # step k runs after the k-th token: a prompt stays in the decoder (all G rows) while one of its rows goes on
    lengths = [max(len(c.token_ids) for c in g.completions) for g in shared]
    held = [params.completions_per_prompt * sum(n > k for n in lengths) for k in range(1, max(lengths))]
    assert [rows for rows, _ in shared_calls[1:]] == held
    assert held[-1] < held[0]  # a prompt left while another's rows went on


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_engine_logprobs_equal_the_models_own_forward_on_pixels(load, samples, arch):
    """The HF engine's sampling log-probs (cached features, DeepStack maps injected at the one prefill per prompt,
    the shared-prefix decode step with Qwen3's q/k norms) against the transformers model called with pixel_values on
    each prompt + completion, with left-padded prompts and rows that finish at different steps."""
    model, processor = load(arch, spread_by=0.1)
    assert SharedPrefixDecoder.supports(model)
    engine = _engine(model, processor, batch_prompts=3)
    batch = [samples[0], samples[5], samples[2]]  # different prompt lengths: a left-padded chunk
    params = SamplingParams(completions_per_prompt=3, temperature=0.8, max_new_tokens=10, seed=2)
    forbidden = forbidden_mask(processor.tokenizer, model.config.get_text_config().vocab_size)
    hook = ForcedLogits(model, always=[processor.tokenizer.eos_token_id], bonus=3.0)  # on the reference's too
    try:
        groups = engine.generate(batch, params)
        diffs = []
        for s, g in zip(batch, groups):
            text = processor.apply_chat_template(render_messages(s), add_generation_prompt=True, tokenize=False)
            for c in g.completions:
                inputs = processor(text=[text], images=[load_image(s.image)], return_tensors="pt")
                comp = torch.tensor([c.token_ids])
                inputs["input_ids"] = torch.cat([inputs["input_ids"], comp], 1)
                inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(comp)], 1)
                inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(comp)], 1)
                with torch.no_grad():
                    logits = model(**inputs).logits[0, -comp.shape[1] - 1 : -1]  # [C, V]: predicting each token
                ref = torch.log_softmax(logits.masked_fill(forbidden, -torch.inf) / 0.8, -1)[
                    range(comp.shape[1]), c.token_ids
                ]
                diffs.append(float((ref - torch.tensor(c.logprobs)).abs().max()))
    finally:
        hook.remove()
    lengths = [len(c.token_ids) for g in groups for c in g.completions]
    assert len(set(lengths)) > 2 and max(lengths) >= 6, lengths  # rows finished at different steps
    # Qwen3.5 decodes its Gated DeltaNet by the recurrent rule, the whole-row forward by the chunked one: float32
    # rounds them apart by ~1e-5 (transformers' own generate against its own forward on this model: up to 1.5e-5)
    assert max(diffs) <= (2e-5 if arch == "qwen3_5" else 1e-5)


def test_dropping_finished_prompts_changes_no_token_or_logprob(load, samples):
    """The decoder without its finished prompts gives the rows still sampling the same logits as a decoder that steps
    every row to the end: the same tokens, and the same log-probs up to the matrix kernels' rounding of a smaller
    batch (bit for bit on an AMD EPYC's kernels; up to 3e-6 on an Intel AVX-512 machine's, measured 2026-12-03). A
    row mapped to another row's KV or bias would differ by far more."""
    model, processor = load("qwen2_5_vl", spread_by=0.1)
    engine = _engine(model, processor, batch_prompts=4)
    keep_all = _engine(model, processor, batch_prompts=4, decode=partial(decode_shared, drop_finished=False))
    batch = [samples[0], samples[5], samples[2], samples[3]]
    params = SamplingParams(completions_per_prompt=4, temperature=1.0, max_new_tokens=12, seed=3)
    hook = ForcedLogits(model, always=[processor.tokenizer.eos_token_id], bonus=5.0)
    try:
        dropped = engine.generate(batch, params)
        dropped_rows = [rows for rows, _ in hook.calls[1:]]
        del hook.calls[:]
        kept = keep_all.generate(batch, params)
        kept_rows = [rows for rows, _ in hook.calls[1:]]
    finally:
        hook.remove()
    assert dropped_rows[-1] < dropped_rows[0] and set(kept_rows) == {16}  # prompts were dropped, or not
    a, b = [c for g in dropped for c in g.completions], [c for g in kept for c in g.completions]
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert max(abs(x - y) for c, d in zip(a, b) for x, y in zip(c.logprobs, d.logprobs)) <= 1e-5


def test_the_decode_runs_in_inference_mode(load, samples):
    """Every HF decode (a one-turn rollout's and a continued turn's) runs under `torch.inference_mode`: none of its
    tensors reaches a graph, and its ~2,000 ops a step skip autograd's version counters and view records."""
    model, processor = load("qwen2_5_vl")
    seen = []

    def spy(*args):
        seen.append(torch.is_inference_mode_enabled())
        return decode_shared(*args)

    engine = _engine(model, processor, decode=spy)
    engine.generate([samples[0]], SamplingParams(completions_per_prompt=2, max_new_tokens=3, seed=0))
    assert seen == [True] and not torch.is_inference_mode_enabled()


def test_a_runs_engine_decodes_the_steps_prompts_as_one_batch(load):
    """`from_config` (the engine a run builds): one prefill and decode for a step's prompts, the KV the planner
    counts, not chunks of the eval default 8."""
    from types import SimpleNamespace

    from vlgrpo.config import load_config
    from vlgrpo.policy.prompt import PromptSettings
    from vlgrpo.rollout.build import build_engine

    model, processor = load("qwen2_5_vl")
    cfg = load_config(None, ["train.prompts_per_step=12", "data.answer_format=answer"])
    lm, prompt = SimpleNamespace(model=model, processor=processor), PromptSettings.from_config(cfg, "qwen2_5")
    engine = build_engine("hf", lm, VisionCache(model, processor), prompt, run=cfg)
    assert engine.batch_prompts == 12 and engine.prompt_kw["answer_format"] == "answer"


def test_placeholder_tokens_are_never_sampled_even_when_favoured(load, samples):
    model, processor = load("qwen2_5_vl")
    bad = placeholder_token_ids(processor.tokenizer)
    engine = _engine(model, processor)
    hook = ForcedLogits(model, always=bad, bonus=30.0)  # a policy that would pick a placeholder ~always
    try:
        groups = engine.generate(samples[:2], SamplingParams(completions_per_prompt=8, max_new_tokens=6, seed=0))
    finally:
        hook.remove()
    ids = {t for g in groups for c in g.completions for t in c.token_ids}
    assert ids and not ids & set(bad)
    assert engine.stats()["rollout/placeholder_sampled"] == 0


def test_eos_is_kept_in_token_ids_and_stop_strings_cut_the_text(load, samples):
    model, processor = load("qwen2_5_vl")
    tok = processor.tokenizer
    answer = tok("<answer>3</answer> tail")["input_ids"]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = _engine(model, processor)
    hook = ForcedLogits(model, seq=answer[:4] + [eos])
    try:
        (g,) = engine.generate(samples[:1], SamplingParams(completions_per_prompt=2, temperature=0, max_new_tokens=10))
    finally:
        hook.remove()
    for c in g.completions:
        assert c.token_ids == answer[:4] + [eos] and c.finish_reason == "stop"
        assert c.text == tok.decode(answer[:4])  # EOS is in the ids, not in the text
    hook = ForcedLogits(model, seq=answer)
    try:
        (g,) = engine.generate(samples[:1], SamplingParams(temperature=0, max_new_tokens=20, stop=["</answer>"]))
    finally:
        hook.remove()
    (c,) = g.completions
    assert c.finish_reason == "stop" and c.text == "<answer>3"
    assert tok.decode(c.token_ids).endswith("</answer>") and len(c.token_ids) < len(answer)
    s = engine.stats()
    assert (s["rollout/finish_stop"], s["rollout/finish_length"]) == (3, 0)


def test_sample_next_top_k_top_p_and_reported_logprobs():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    ids, logp = sample_next(logits, SamplingParams(top_k=2), None, gen)
    assert set(ids.tolist()) == {2, 3}
    assert torch.allclose(logp, probs.log()[ids])  # the untruncated distribution's log-prob
    ids, _ = sample_next(logits, SamplingParams(top_p=0.5), None, gen)
    assert set(ids.tolist()) == {2, 3}  # 0.4 < 0.5, 0.4 + 0.3 >= 0.5: keep two
    assert abs((ids == 3).float().mean().item() - 4 / 7) < 0.03
    ids, _ = sample_next(logits, SamplingParams(top_p=0.4), None, gen)
    assert set(ids.tolist()) == {3}
    forbidden = torch.tensor([False, False, False, True])
    ids, logp = sample_next(logits, SamplingParams(temperature=0.5), forbidden, gen)
    assert 3 not in ids.tolist()
    # temperature 0.5 squares the probabilities; the forbidden id is renormalised away: p = (.01, .04, .09) / .14
    assert torch.allclose(logp, torch.log(torch.tensor([0.01, 0.04, 0.09]) / 0.14)[ids], atol=1e-6)
    ids, logp = sample_next(logits[:1], SamplingParams(temperature=0), forbidden, None)
    assert ids.tolist() == [2] and math.isclose(logp.item(), math.log(0.3 / 0.6), abs_tol=1e-6)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="SamplingParams.completions_per_prompt must be >= 1"):
        SamplingParams(completions_per_prompt=0)


def test_update_weights_bumps_the_version_and_restores_train_mode(load, samples):
    model, processor = load("qwen2_5_vl")
    engine = _engine(model, processor)
    engine.update_weights(None, version=7)
    model.train()
    (g,) = engine.generate(samples[:1], SamplingParams(completions_per_prompt=2, max_new_tokens=2))
    assert g.policy_version == 7 and model.training
    model.eval()
