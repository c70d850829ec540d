"""The real vLLM engine (vLLM's CPU build, `make test-vllm`) on the tiny Qwen2.5-VL and Qwen3-VL in fp32: greedy tokens
equal the HF engine's, the prompt vLLM expands equals ours, weight sync through vLLM's reload (language, vision with
Qwen3-VL's DeepStack mergers, and tied embeddings; plain and merged-LoRA weights) keeps its log-probs within 1e-3 of
the trainer's, prefix caching hits, and the vision tower runs once per unique image. Prompts with two images or a
video (Qwen2-VL too) decode as in the HF engine, their expanded ids equal ours token for token (Qwen3-VL's
timestamps), their log-probs match the trainer's. One engine per arch and image-input mode is launched per module,
when a test first asks for it, with room for 4 images and a video per prompt."""

import dataclasses
import os

import pytest
import torch

from vlgrpo.config import load_config
from vlgrpo.data.adapters import load_samples
from vlgrpo.data.synth import synth_dataset
from vlgrpo.data.video import VideoSampling, visual_sources
from vlgrpo.grpo.logprobs import token_logprobs, truncated_token_logprobs
from vlgrpo.grpo.rollout_is import logprob_gap
from vlgrpo.models import is_visual, load_model, placeholder_token_ids
from vlgrpo.policy.forward import completion_logits
from vlgrpo.policy.prompt import PromptSettings, build_prompt, forbidden_mask
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.hf import HFEngine
from vlgrpo.rollout.vllm.engine import build_request
from vlgrpo.trainer.batch import make_batch
from vlgrpo.vision_cache import ImageFeatures, VisionCache

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
ENGINE_KWARGS = {"dtype": "float32", "enforce_eager": True, "block_size": 32}  # CPU attention: blocks of 32


ARCHS = ["qwen2_5_vl", "qwen3_vl"]
MODES = ["embeds", "pixels"]
LIMITS = {"image": 4, "video": 1}
VIDEO = VideoSampling(max_pixels=50176)  # 224 x 224 frames: 64 (Qwen2/2.5-VL) or 49 (Qwen3-VL) tokens per patch


@pytest.fixture(scope="module")
def spread_model(tmp_path_factory, tiny_model_dir, spread, spread_deepstack):
    """arch -> the tiny model with its LM weights spread out (seeded), saved: greedy decoding then varies per sample.
    Qwen3-VL's DeepStack mergers are spread too, so that its tokens depend on the DeepStack maps vLLM is given."""
    saved: dict[str, str] = {}

    def get(arch: str) -> str:
        if arch not in saved:
            lm = load_model(tiny_model_dir(arch))
            spread(lm.model, 0.5)
            assert (spread_deepstack(lm.model, 1.0) > 0) is (arch == "qwen3_vl")
            out = tmp_path_factory.mktemp(f"spread_{arch}")
            lm.model.save_pretrained(out)
            lm.processor.save_pretrained(out)
            saved[arch] = str(out)
        return saved[arch]

    return get


def _launch(path, mm_input):
    from vlgrpo.rollout.vllm.engine import VLLMEngine

    lm = load_model(path)
    cache = VisionCache(lm.model.eval(), lm.processor, trainable=True)  # the tests change vision weights
    engine = VLLMEngine.launch(
        path,
        lm.processor,
        cache,
        mm_input=mm_input,
        max_model_len=512,
        gpu_memory_utilization=0.5,
        llm_kwargs=ENGINE_KWARGS,
        limit_mm_per_prompt=LIMITS,
        prompt=PromptSettings(video_sampling=VIDEO),
    )
    return lm, cache, engine


@pytest.fixture(scope="module")
def engines(spread_model):
    """(arch, mm_input) -> (LoadedModel, VisionCache, VLLMEngine), launched once per module on first use."""
    launched: dict[tuple[str, str], tuple] = {}

    def get(arch: str, mode: str):
        if (arch, mode) not in launched:
            launched[arch, mode] = _launch(spread_model(arch), mode)
        return launched[arch, mode]

    return get


@pytest.fixture(scope="module")
def embeds_engine(engines):
    return engines("qwen2_5_vl", "embeds")


@pytest.fixture(scope="module")
def pixels_engine(engines):
    return engines("qwen2_5_vl", "pixels")


def _trainer_logps(model, processor, cache, groups, top_k=0, top_p=1.0, temperature=1.0):
    """(trainer log-probs replayed on the engine's support, full-vocabulary log-probs, batch) of sampled groups (any
    mix of images and a video per prompt)."""
    tok = processor.tokenizer
    feats = cache.get_rows([visual_sources(g.sample, VIDEO) for g in groups])
    b = make_batch(
        groups,
        feats,
        tok.pad_token_id,
        model.config.image_token_id,
        placeholder_token_ids(tok),
        video_token_id=model.config.video_token_id,
    )
    forbidden = forbidden_mask(tok, model.config.get_text_config().vocab_size)
    with torch.no_grad():
        logits = completion_logits(model, b.batch, b.features)
    ids = b.batch.completion_ids
    replay = truncated_token_logprobs(
        logits, ids, temperature=temperature, forbidden=forbidden, top_k=top_k, top_p=top_p
    )
    full = token_logprobs(logits, ids, temperature=temperature, forbidden=forbidden)[0]
    return replay, full, b


def test_prefix_cache_hits_and_one_encoder_call_per_unique_image(embeds_engine, samples):
    lm, cache, engine = embeds_engine
    # first test of the module: vLLM reads its metrics from the newest engine of the process (see _prefix_cache_hits)
    engine.update_weights(None, engine.policy_version + 1)  # resets the prefix cache
    cache.set_step(engine.policy_version)
    engine.reset_stats()
    images = [samples[5], samples[6], samples[5]]  # two unique images, one asked twice
    params = SamplingParams(completions_per_prompt=4, temperature=1.0, max_new_tokens=8, seed=6)
    groups = engine.generate(images, params)
    stats = engine.stats()
    print(f"prefix-cache hit tokens for 3 prompts x G=4: {stats['rollout/prefix_cache_hit_tokens']}")
    assert stats["rollout/encoder_calls"] == 1 and stats["rollout/images_encoded"] == 2
    # hits count whole 32-token blocks: at least G - 1 = 3 completions of each prompt reuse its full blocks
    assert stats["rollout/prefix_cache_hit_tokens"] >= sum(3 * (len(g.prompt_ids) // 32) * 32 for g in groups) > 0
    # the rate is vLLM's hits over its lookups: each of the 12 samples looks its prompt up
    queried = stats["rollout/prefix_cache_query_tokens"]
    assert queried >= sum(4 * len(g.prompt_ids) for g in groups) - 4 * len(groups)  # less the last token it computes
    assert stats["rollout/prefix_cache_hit_rate"] == stats["rollout/prefix_cache_hit_tokens"] / queried
    assert 0.5 < stats["rollout/prefix_cache_hit_rate"] < 1


def _request(engine, sample):
    """The request the engine sends for one sample (its own build path)."""
    p = build_prompt(sample, engine.processor, engine.geometry, **engine.prompt_kw)
    feats = engine.cache.get_rows([p.sources])[0] if engine.mm_input == "embeds" else None
    return p, build_request(p, engine.format, feats, engine.mm_input, geometry=engine.geometry)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", MODES)
def test_greedy_tokens_and_prompt_lengths_equal_the_hf_engine(arch, mode, engines, samples):
    lm, cache, engine = engines(arch, mode)
    greedy = SamplingParams(completions_per_prompt=1, temperature=0, max_new_tokens=12)
    want = [g.completions[0].token_ids for g in HFEngine(lm.model, lm.processor, cache).generate(samples[:8], greedy)]
    assert [g.completions[0].token_ids for g in engine.generate(samples[:8], greedy)] == want
    assert len({tuple(w) for w in want}) == 8  # varied sequences: agreement is not one token repeated
    # the prompt vLLM expands (one image pad sent) has exactly the trainer's length (16 image tokens at 112 px; Qwen3-VL
    # resizes it to 128 px: 8 x 8 patches of 16 px, merged 2 x 2)
    prompt, request = _request(engine, samples[0])
    out = engine.llm.generate([request], vllm.SamplingParams(max_tokens=1), use_tqdm=False)
    assert len(out[0].prompt_token_ids) == len(prompt.input_ids) and prompt.input_ids.count(engine.image_token_id) == 16
    assert request["prompt_token_ids"].count(engine.image_token_id) == 1


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(4 two-image prompts, 4 video prompts) of a mixed shapes file at 64 px. The videos are 4-frame lists; two of
    them were taken at 4 fps (a row's own rate), which moves Qwen2.5-VL's temporal positions (second_per_grid_ts 0.5
    instead of 1) and Qwen3-VL's timestamps (<0.1 seconds> instead of <0.2 seconds>)."""
    out = tmp_path_factory.mktemp("mixed")
    synth_dataset(out, 30, seed=3, image_size=64, kinds=("count", "compare", "motion"))
    rows = load_samples(out / "train.jsonl").samples
    two = [s for s in rows if len(s.images) == 2][:4]
    videos = [s for s in rows if s.video is not None][:4]
    videos[2:] = [dataclasses.replace(s, video=dataclasses.replace(s.video, fps=4.0)) for s in videos[2:]]
    return two, videos


MIXED_ARCHS = ["qwen2_vl", *ARCHS]


@pytest.mark.parametrize("arch", MIXED_ARCHS)
@pytest.mark.parametrize("mode", MODES)
def test_two_image_and_video_prompts_decode_like_the_hf_engine(arch, mode, engines, mixed):
    """Greedy tokens equal the HF engine's on 4 two-image and 4 video prompts; vLLM's expansion of the request (one
    pad per image, the video's unexpanded placeholder) is our prompt token for token; sampled log-probs are the
    trainer's (the first token's and every token's) within 1e-3."""
    lm, cache, engine = engines(arch, mode)
    two, videos = mixed
    greedy = SamplingParams(completions_per_prompt=1, temperature=0, max_new_tokens=12)
    hf = HFEngine(lm.model, lm.processor, cache, video_sampling=VIDEO)
    want = [g.completions[0].token_ids for g in hf.generate(two + videos, greedy)]
    got = [g.completions[0].token_ids for g in engine.generate(two + videos, greedy)]
    agree = [a == b for a, b in zip(got, want)]
    print(f"[{arch} {mode}] greedy agreement: two images {sum(agree[:4])}/4, video {sum(agree[4:])}/4")
    assert got == want
    assert len({tuple(w) for w in want[:4]}) == 4 and len({tuple(w) for w in want[4:]}) == 4  # varied sequences
    pairs = [_request(engine, s) for s in two + videos]
    outs = engine.llm.generate([r for _, r in pairs], vllm.SamplingParams(max_tokens=1), use_tqdm=False)
    for (prompt, request), out in zip(pairs, outs):
        assert list(out.prompt_token_ids) == prompt.input_ids  # vLLM wrote our expansion, timestamps included
        assert len(request["prompt_token_ids"]) < len(prompt.input_ids)  # it was sent unexpanded
    assert all(p.image_grid_thw.shape[0] == 2 for p, _ in pairs[:4])
    assert all(p.video_grid_thw[0, 0].item() == 2 and p.mm_token_type_ids.count(2) > 0 for p, _ in pairs[4:])
    params = SamplingParams(completions_per_prompt=2, temperature=1.0, max_new_tokens=12, seed=11)
    groups = engine.generate(two + videos, params)
    replay, _, b = _trainer_logps(lm.model, lm.processor, cache, groups)
    first = (replay[:, 0] - b.engine_logp[:, 0]).abs().max().item()
    worst = logprob_gap(replay, b.engine_logp, b.loss_mask)[1]
    print(
        f"[{arch} {mode}] |vLLM - trainer| log-prob max: first token {first:.2e}, every token {worst:.2e}; "
        f"prompt ids equal on {len(pairs)}/{len(pairs)}"
    )
    assert first < 1e-3 and worst < 1e-3


def test_qwen2_5_vl_video_embeddings_carry_their_seconds_per_temporal_patch(engines, mixed):
    """vLLM places a Qwen2.5-VL video given as embeddings 1 s per temporal patch unless the request says otherwise:
    the 4 fps videos are sent with second_per_grid_ts 0.5, and without it they decode other tokens."""
    lm, cache, engine = engines("qwen2_5_vl", "embeds")
    videos = mixed[1]
    requests = [_request(engine, s)[1] for s in videos]
    seconds = [r["multi_modal_data"]["video"]["second_per_grid_ts"].tolist() for r in requests]
    assert seconds == [[1.0], [1.0], [0.5], [0.5]]
    params = vllm.SamplingParams(temperature=0, max_tokens=12)

    def without_seconds(r):
        video = {k: v for k, v in r["multi_modal_data"]["video"].items() if k != "second_per_grid_ts"}
        return {**r, "multi_modal_data": {"video": video}}

    sent = [list(o.outputs[0].token_ids) for o in engine.llm.generate(requests, params, use_tqdm=False)]
    # the same ids and embeddings hash alike: clear the prefix and multimodal caches, else their KV blocks are reused
    engine.llm.reset_prefix_cache()
    engine.llm.reset_mm_cache()
    dropped = [
        list(o.outputs[0].token_ids)
        for o in engine.llm.generate([without_seconds(r) for r in requests], params, use_tqdm=False)
    ]
    engine.llm.reset_prefix_cache()
    engine.llm.reset_mm_cache()
    assert sent[:2] == dropped[:2] and sent[2:] != dropped[2:]


def test_a_prompt_above_the_limit_is_refused_naming_the_sample_and_the_key(engines, mixed):
    from vlgrpo.rollout.vllm.inputs import check_prompt_limits
    from vlgrpo.types import InputError

    lm, cache, engine = engines("qwen2_5_vl", "embeds")
    two = mixed[0][0]
    prompt = build_prompt(two, lm.processor, engine.geometry, **engine.prompt_kw)
    with pytest.raises(InputError, match=rf"sample '{two.id}' holds 2 images, above rollout.vllm.limit_mm_per_prompt"):
        check_prompt_limits(two.id, prompt, {"image": 1, "video": 1})
    limits, engine.limits = engine.limits, {"image": 1, "video": 0}
    try:
        with pytest.raises(InputError, match="rollout.vllm.limit_mm_per_prompt"):
            engine.generate([two], SamplingParams(completions_per_prompt=1, temperature=0, max_new_tokens=2))
    finally:
        engine.limits = limits


def test_qwen3_vl_images_carry_every_deepstack_map_and_the_tokens_depend_on_them(engines, samples):
    """A Qwen3-VL image goes to vLLM as one [N, (1 + L) * H] tensor: the merged embeddings, then DeepStack map 0, 1, ...
    (what vLLM's own tower returns and its language model splits again). The greedy test above passes only if vLLM
    adds each map at its layer: the same requests with the maps zeroed, or with the two maps swapped, decode other
    tokens."""
    lm, cache, engine = engines("qwen3_vl", "embeds")
    hidden = lm.model.config.get_text_config().hidden_size
    feats = cache.get([s.image for s in samples[:8]])
    requests = [_request(engine, s)[1] for s in samples[:8]]
    sent = requests[0]["multi_modal_data"]["image"]["image_embeds"]
    assert feats[0].deepstack.shape == (2, 16, hidden) and sent.shape == (16, 3 * hidden)
    assert torch.equal(sent[:, :hidden], feats[0].embeds)
    assert all(torch.equal(sent[:, (1 + i) * hidden : (2 + i) * hidden], feats[0].deepstack[i]) for i in range(2))

    def decode(edit) -> list[list[int]]:
        """vLLM's greedy tokens for the requests with `edit` applied to each image's [N, (1 + L) * H] embeddings."""
        edited = []
        for r in requests:
            image = r["multi_modal_data"]["image"]
            edited.append({**r, "multi_modal_data": {"image": {**image, "image_embeds": edit(image["image_embeds"])}}})
        outs = engine.llm.generate(edited, vllm.SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    main, maps = slice(0, hidden), slice(hidden, None)
    tokens = decode(lambda e: e)
    zeroed = decode(lambda e: torch.cat([e[:, main], torch.zeros_like(e[:, maps])], 1))
    swapped = decode(lambda e: torch.cat([e[:, main], e[:, 2 * hidden :], e[:, hidden : 2 * hidden]], 1))
    changed = [sum(a != b for a, b in zip(tokens, other)) for other in (zeroed, swapped)]
    print(
        f"[qwen3_vl] greedy sequences of 8 changed with the DeepStack maps zeroed: {changed[0]}, swapped: {changed[1]}"
    )
    assert min(changed) >= 2
    # features short of their maps (another model's, or a cache entry without them) are refused before vLLM sees them
    with pytest.raises(ValueError, match="takes the merged embeddings and 2 maps"):
        build_request(
            build_prompt(samples[0], lm.processor),
            engine.image_token_id,
            ImageFeatures(feats[0].embeds, feats[0].grid_thw),
            "embeds",
            engine.deepstack_maps,
        )


def _perturb(model, scale=1.01):
    """Change every weight: language, vision tower and the tied embedding / LM head."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", MODES)
def test_logprobs_match_the_trainer_after_syncing_changed_weights(arch, mode, engines, samples):
    """`pixels`: vLLM's own tower (Qwen3-VL's DeepStack mergers included) runs on the synced vision weights."""
    lm, cache, engine = engines(arch, mode)
    assert engine.tied_embeddings and lm.model.config.tie_word_embeddings
    params = SamplingParams(completions_per_prompt=4, temperature=1.0, max_new_tokens=12, seed=3)
    replay, _, b = _trainer_logps(lm.model, lm.processor, cache, engine.generate(samples[:4], params))
    before = logprob_gap(replay, b.engine_logp, b.loss_mask)[1]
    assert before < 1e-3  # before any sync
    _perturb(lm.model)
    version = engine.policy_version + 1
    cache.set_step(version)
    stale, _, b = _trainer_logps(lm.model, lm.processor, cache, engine.generate(samples[:4], params))
    assert logprob_gap(stale, b.engine_logp, b.loss_mask)[1] > 1e-2  # without a sync the engine is off-policy
    engine.update_weights(lm.model.state_dict().items(), version)  # what PlainBackend.named_weights yields
    groups = engine.generate(samples[:4], params)
    replay, _, b = _trainer_logps(lm.model, lm.processor, cache, groups)
    mean, worst = logprob_gap(replay, b.engine_logp, b.loss_mask)
    print(
        f"[{arch} {mode}] |vLLM - trainer| log-prob max {before:.2e} before any sync; after the sync mean "
        f"{mean:.2e}, max {worst:.2e}"
    )
    assert worst < 1e-3 and groups[0].policy_version == version
    assert engine.stats()["rollout/params_pushed"] > 0


def test_merged_lora_weights_sync_through_the_lora_backend(embeds_engine, samples, tmp_path):
    from vlgrpo.trainer.lora import LoRABackend

    lm, cache, engine = embeds_engine
    cfg = load_config(None, ["train.backend=lora", "train.lora.rank=4", "grpo.beta=0"])
    backend = LoRABackend(lm.model, cfg, need_reference=False)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():  # a trained adapter: B != 0
        for name, p in backend.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    engine.update_weights(backend.named_weights(), engine.policy_version + 1)
    params = SamplingParams(completions_per_prompt=4, temperature=1.0, max_new_tokens=12, seed=4)
    groups = engine.generate(samples[:4], params)
    replay, _, b = _trainer_logps(backend.model.eval(), lm.processor, cache, groups)
    mean, worst = logprob_gap(replay, b.engine_logp, b.loss_mask)
    print(f"[lora] after sync: |vLLM - trainer| log-prob mean {mean:.2e}, max {worst:.2e}")
    assert worst < 1e-3
    with torch.no_grad(), backend._peft.disable_adapter():  # the adapter really changed the policy
        base, _, _ = _trainer_logps(backend.model, lm.processor, cache, groups)
    assert (base - replay).abs()[b.loss_mask.bool()].max() > 1e-2


def _vllm_params(engine) -> dict:
    """vLLM's own parameters (its fused layers: qkv_proj, gate_up_proj), copied to the CPU."""

    def read(worker):
        return {n: p.detach().cpu().clone() for n, p in worker.get_model().named_parameters()}

    return engine.llm.collective_rpc(read)[0]


@pytest.mark.parametrize("backend_name", ["plain", "lora"])
def test_a_bucketed_sync_of_what_changes_leaves_vllm_as_a_whole_model_sync(backend_name, engines, samples):
    """Buckets of the weights that change (a full fine-tune's language model; LoRA on q_proj and v_proj alone, so k_proj
    travels as their sibling: no fused qkv_proj is sent in part) leave vLLM's every parameter bit for bit as a sync of
    the whole model does."""
    from vlgrpo.rollout.weight_stream import WeightBuckets, plan_buckets
    from vlgrpo.trainer.backends import PlainBackend
    from vlgrpo.trainer.lora import LoRABackend

    served, _, engine = engines("qwen2_5_vl", "pixels")  # pixels: vLLM's own tower takes the synced vision weights
    lm = load_model(engine.llm.llm_engine.model_config.model)  # a trainer's copy of the engine's checkpoint
    overrides = ["train.lora.rank=4", "train.lora.target_modules=[q_proj,v_proj]", "grpo.beta=0"]
    cfg = load_config(None, [f"train.backend={backend_name}", *overrides])
    version = engine.policy_version + 1
    try:
        engine.update_weights(lm.model.state_dict().items(), version)  # vLLM holds what this trainer starts from
        backend = (LoRABackend if backend_name == "lora" else PlainBackend)(lm.model, cfg, need_reference=False)
        gen = torch.Generator().manual_seed(5)
        with torch.no_grad():  # a trained policy: every trainable weight moved (LoRA: B != 0)
            for p in (p for p in backend.model.parameters() if p.requires_grad):
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        weights = WeightBuckets(plan_buckets(backend.sync_specs(), 64 * 1024), backend.sync_tensors)
        names = {n for b in weights.buckets for n in b.names}
        if backend_name == "lora":
            assert any(n.endswith("k_proj.weight") for n in names) and not any("mlp" in n for n in names)
        assert len(weights.buckets) > 1 and not any(is_visual(n) for n in names)  # the frozen tower stays
        engine.update_weights(weights, version + 1)
        bucketed = _vllm_params(engine)
        engine.update_weights(backend.named_weights(), version + 2)  # everything, as every sync sent before buckets
        whole = _vllm_params(engine)
        assert list(bucketed) == list(whole)
        assert [n for n in whole if not torch.equal(bucketed[n], whole[n])] == []
    finally:
        engine.update_weights(served.model.state_dict().items(), version + 3)  # what the other tests expect


def test_truncated_sampling_is_compared_on_the_engines_support(pixels_engine, samples):
    lm, cache, engine = pixels_engine
    params = SamplingParams(completions_per_prompt=4, temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=12, seed=5)
    groups = engine.generate(samples[:4], params)
    replay, full, b = _trainer_logps(lm.model, lm.processor, cache, groups, top_k=5, top_p=0.9, temperature=0.8)
    assert logprob_gap(replay, b.engine_logp, b.loss_mask)[1] < 1e-3  # like with like
    assert logprob_gap(full, b.engine_logp, b.loss_mask)[1] > 1e-2  # the kept-mass bias a full softmax carries


def test_our_top_k_top_p_replay_equals_vllms_own_sampler_op():
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    from vlgrpo.grpo.logprobs import _truncate

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 200, generator=gen) * 3
    for k, p in [(5, 1.0), (0, 0.9), (20, 0.7), (1, 0.5)]:
        kk = torch.full((64,), k, dtype=torch.long) if k else None
        pp = torch.full((64,), p) if p < 1 else None
        theirs = torch.isfinite(apply_top_k_top_p_pytorch(logits.clone(), kk, pp))
        assert torch.equal(_truncate(logits.unsqueeze(0), k, p)[0], theirs), (k, p)


def _with_mrope_section(config: dict, section: list[int]) -> int:
    """Set every `mrope_section` in a saved config (top level and text config) to `section`; how many were set."""
    found = 0
    for key, value in config.items():
        if key == "mrope_section":
            config[key] = list(section)
            found += 1
        elif isinstance(value, dict):
            found += _with_mrope_section(value, section)
    return found


def test_a_chosen_mrope_section_decodes_like_the_hf_engine(tmp_path, spread, samples):
    """A checkpoint with its own M-RoPE split in its config.json (the slow-width bases of docs/demo-seeds.md: base
    1000, (1, 3, 12)) decodes in vLLM exactly as in the HF engine, and the split matters: the same weights with the
    default split decode otherwise."""
    import json
    import shutil

    from vlgrpo.tiny import TinySpec, init_tiny

    path = init_tiny(tmp_path / "slow", spec=TinySpec(rope_theta=1000.0), seed=0)
    config = json.loads((path / "config.json").read_text())
    assert _with_mrope_section(config, [1, 3, 12]) >= 1
    (path / "config.json").write_text(json.dumps(config))
    lm = load_model(path)
    assert lm.model.config.get_text_config().rope_parameters["mrope_section"] == [1, 3, 12]
    spread(lm.model, 0.5)
    lm.model.save_pretrained(path)
    lm, cache, engine = _launch(str(path), "embeds")
    greedy = SamplingParams(completions_per_prompt=1, temperature=0, max_new_tokens=12)
    want = [g.completions[0].token_ids for g in HFEngine(lm.model, lm.processor, cache).generate(samples[:8], greedy)]
    assert [g.completions[0].token_ids for g in engine.generate(samples[:8], greedy)] == want
    assert len({tuple(w) for w in want}) == 8
    default = tmp_path / "default_split"
    shutil.copytree(path, default)
    config = json.loads((default / "config.json").read_text())
    assert _with_mrope_section(config, [4, 6, 6]) >= 1
    (default / "config.json").write_text(json.dumps(config))
    other = load_model(default)
    hf_other = HFEngine(other.model, other.processor, VisionCache(other.model.eval(), other.processor))
    assert [g.completions[0].token_ids for g in hf_other.generate(samples[:8], greedy)] != want


def test_qwen3_5_is_refused_on_vllms_cpu_build_before_launch(tmp_path, tiny_model_dir):
    """vLLM's CPU build runs Qwen3.5's Gated DeltaNet wrong: NaN logits on every CPU kind this project has run on
    (AVX2, AVX-512 with bf16, AMX; 2026-12-05/06), and in one full CI run of 2026-12-07 finite logits for other tokens
    than the HF engine's greedy ones, which no output check can catch. The engine refuses the model before launching
    vLLM, naming rollout.engine=hf; a dense model still launches (the other tests here)."""
    from vlgrpo.rollout.vllm.engine import VLLMEngine

    lm = load_model(tiny_model_dir("qwen3_5"))
    with pytest.raises(RuntimeError, match="Gated DeltaNet.*rollout.engine=hf"):
        VLLMEngine.launch(tiny_model_dir("qwen3_5"), lm.processor, None, max_model_len=512, llm_kwargs=ENGINE_KWARGS)


def test_colocated_runs_turn_vllms_multimodal_processor_cache_off(tmp_path, tiny_model_dir):
    """What a colocated run's config hands `vllm.LLM` (`settings.launch_args`; tests/rollout/test_vllm.py checks the
    arguments for each placement and family) reaches vLLM's own config: the processor cache off. (Last in the module:
    a second engine in the process tears down vLLM's groups when it goes, and the module's engines with them.)"""
    from vlgrpo.rollout.vllm.engine import VLLMEngine
    from vlgrpo.rollout.vllm.settings import launch_args

    lm = load_model(tiny_model_dir())
    cfg = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_dir()}",
            "rollout.engine=vllm",
            "rollout.vllm.enable_sleep_mode=false",
            "rollout.vllm.engine_kwargs={enforce_eager: true, block_size: 32}",
            "model.dtype=float32",
        ],
    )
    args = launch_args(cfg, lm, PromptSettings())
    args["llm_kwargs"].pop("distributed_executor_backend", None)  # the earlier engines initialised torch.distributed
    engine = VLLMEngine.launch(cfg.model.name_or_path, lm.processor, VisionCache(lm.model.eval(), lm.processor), **args)
    assert engine.llm.llm_engine.vllm_config.model_config.multimodal_config.mm_processor_cache_gb == 0
    assert engine.release_mm_caches
