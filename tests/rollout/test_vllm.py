"""vLLM backend: request building, name mapping, sync and output handling on the CPU with a stand-in `vllm` module;
the real engine runs only in the gpu-marked test (skipped without CUDA and vllm)."""

import importlib.util
import math
import sys
import types
from types import SimpleNamespace as NS

import pytest
import torch
from PIL import Image

from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.inputs import build_prompt, collate_groups, completion_logprobs, forbidden_mask
from vlgrpo.rollout.vllm import (
    PLACEHOLDER_BIAS,
    VLLMEngine,
    build_request,
    is_visual,
    logprob_abs_diff,
    sampling_kwargs,
    sync_params,
    to_completions,
    vllm_param_name,
)
from vlgrpo.types import Completion, RolloutGroup
from vlgrpo.vision_cache import VisionCache


def test_weight_names_map_to_checkpoint_names():
    cases = {
        "model.language_model.layers.0.self_attn.q_proj.weight":
            "model.language_model.layers.0.self_attn.q_proj.weight",
        "module.model.visual.blocks.0.attn.qkv.weight": "model.visual.blocks.0.attn.qkv.weight",
        "base_model.model.model.language_model.layers.1.mlp.up_proj.base_layer.weight":
            "model.language_model.layers.1.mlp.up_proj.weight",
        "base_model.model.lm_head.modules_to_save.default.weight": "lm_head.weight",
        "model.layers.0._checkpoint_wrapped_module.mlp.down_proj.weight": "model.layers.0.mlp.down_proj.weight",
        "_orig_mod.model.visual.merger.mlp.0.bias": "model.visual.merger.mlp.0.bias",
    }  # fmt: skip
    for hf, expected in cases.items():
        assert vllm_param_name(hf) == expected
    for skipped in ("base_model.model.model.language_model.layers.1.mlp.up_proj.lora_A.default.weight",
                    "base_model.model.lm_head.original_module.weight"):  # fmt: skip
        assert vllm_param_name(skipped) is None
    assert is_visual("model.visual.merger.mlp.0.bias") and is_visual("visual.blocks.0.norm1.weight")
    assert not is_visual("model.language_model.layers.0.mlp.up_proj.weight")


def test_sampling_kwargs_and_requests(load, samples):
    model, processor = load("qwen2_5_vl")
    kw = sampling_kwargs(SamplingParams(n=8, temperature=0.9, top_k=0, max_new_tokens=16, stop=["</answer>"], seed=3),
                         [9, 12])  # fmt: skip
    assert kw["n"] == 8 and kw["top_k"] == -1 and kw["max_tokens"] == 16 and kw["stop"] == ["</answer>"]
    assert kw["logit_bias"] == {9: PLACEHOLDER_BIAS, 12: PLACEHOLDER_BIAS} and kw["logprobs"] == 0
    assert sampling_kwargs(SamplingParams(n=4, temperature=0), [])["n"] == 1  # vLLM greedy needs n=1

    prompt = build_prompt(samples[0], processor)
    feats = VisionCache(model, processor).get([samples[0].image])[0]
    req = build_request(prompt, feats, "embeds")
    image = req["multi_modal_data"]["image"]
    assert req["prompt_token_ids"] == prompt.input_ids
    assert image["image_embeds"].shape == (16, 128) and image["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert prompt.input_ids.count(model.config.image_token_id) == image["image_embeds"].shape[0]
    req = build_request(prompt, None, "pixels")
    assert isinstance(req["multi_modal_data"]["image"], Image.Image) and len(req["multi_modal_uuids"]["image"][0]) == 64
    with pytest.raises(ValueError, match="mm_input must be one of embeds, pixels"):
        build_request(prompt, feats, "pil")


def _out(ids, logps=None, finish="stop", text="t"):
    lps = [{t: NS(logprob=lp)} for t, lp in zip(ids, logps)] if logps else None
    return NS(token_ids=ids, logprobs=lps, finish_reason=finish, text=text)


def test_outputs_become_completions_and_placeholders_are_cut():
    output = NS(outputs=[_out([5, 6, 2], [-0.1, -0.2, -0.3]), _out([7, 12, 8], [-1.0, -2.0, -3.0], "length")])
    comps, bad = to_completions(output, SamplingParams(n=2), {12}, decode=lambda ids: f"dec{ids}")
    assert bad == 1
    fields = [(c.token_ids, c.logprobs, c.finish_reason, c.text) for c in comps]
    assert fields == [([5, 6, 2], [-0.1, -0.2, -0.3], "stop", "t"), ([7], [-1.0], "placeholder", "dec[7]")]
    greedy, _ = to_completions(NS(outputs=[_out([4])]), SamplingParams(n=3, temperature=0), set(), str)
    assert [c.token_ids for c in greedy] == [[4], [4], [4]]
    comps = [Completion([5, 6], "", "stop", [-1.0, -2.0]), Completion([7], "", "stop", [-0.5])]
    groups = [RolloutGroup(None, [1], comps)]
    mean, worst = logprob_abs_diff(groups, torch.tensor([[-1.1, -2.0], [-0.2, 99.0]]))
    assert math.isclose(mean, (0.1 + 0.0 + 0.3) / 3, abs_tol=1e-6) and math.isclose(worst, 0.3, abs_tol=1e-6)


class FakeLLM:
    """Stands in for vllm.LLM: records requests and syncs; answers with fixed completions and chosen log-probs."""

    def __init__(self, completions=(), logprob_fn=None, **kwargs):
        self.kwargs, self.completions, self.logprob_fn = kwargs, list(completions), logprob_fn
        self.loaded, self.calls, self.requests = [], [], []
        model = NS(load_weights=lambda pairs: self.loaded.extend(name for name, _ in pairs))
        self.llm_engine = NS(model_executor=NS(driver_worker=NS(model_runner=NS(model=model))))

    def generate(self, requests, params, use_tqdm=False):
        self.requests += requests
        self.calls.append(("generate", params.kw["n"]))
        outs = []
        for i, _ in enumerate(requests):
            lps = self.logprob_fn(i) if self.logprob_fn else [None] * len(self.completions)
            outs.append(NS(outputs=[_out(c, lp) for c, lp in zip(self.completions, lps)]))
        return outs

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def reset_encoder_cache(self):
        self.calls.append("reset_encoder_cache")

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: NS(kw=kw)
    module.LLM = FakeLLM
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # launch() sets it; undone after the test
    return module


def test_engine_generates_syncs_and_checks_logprobs_against_the_trainer(load, samples, fake_vllm):
    model, processor = load("qwen2_5_vl")
    tok = processor.tokenizer
    cache = VisionCache(model, processor)
    completions = [[30, 31, tok.eos_token_id], [32, 33]]
    engine = VLLMEngine.launch("ckpt", processor, cache, sleep_level=1, check_model=model, push_visual=True,
                               gpu_memory_utilization=0.3)  # fmt: skip
    llm = engine.llm
    assert llm.kwargs["enable_prefix_caching"] and llm.kwargs["enable_mm_embeds"]
    assert llm.kwargs["limit_mm_per_prompt"] == {"image": 1, "video": 0} and llm.kwargs["gpu_memory_utilization"] == 0.3
    llm.completions = completions

    groups = engine.generate(samples[:2], SamplingParams(n=2, max_new_tokens=4))
    assert [c.token_ids for c in groups[1].completions] == completions and groups[0].policy_version == 0
    assert llm.calls[-1] == ("sleep", 1) and llm.requests[0]["prompt_token_ids"] == groups[0].prompt_ids
    assert "rollout/logprob_abs_diff" not in engine.stats()  # no sync yet, no check

    # sync: language weights only -> prefix cache reset, encoder cache kept
    engine.update_weights([(n, p) for n, p in sync_params(model) if ".visual." not in n], version=1)
    assert llm.calls[-1] == "reset_prefix_cache" and ("wake_up", ["weights"]) in llm.calls
    assert llm.loaded and not any(is_visual(n) for n in llm.loaded)
    engine.update_weights(sync_params(model), version=2)
    assert llm.calls[-1] == "reset_encoder_cache" and any(is_visual(n) for n in llm.loaded)
    assert engine.stats()["rollout/weight_syncs"] == 2

    # after a sync the first rollout compares vLLM's log-probs with the trainer's: here they are off by 0.25
    feats = cache.get([samples[0].image])
    g0 = [RolloutGroup(samples[0], groups[0].prompt_ids, [Completion(c, "", "stop") for c in completions])]
    batch = collate_groups(g0, [feats[0].grid_thw], tok.pad_token_id, model.config.image_token_id)
    with torch.no_grad():
        trainer = completion_logprobs(model, batch, feats, forbidden_mask(tok, len(tok)), 1.0)
    llm.logprob_fn = lambda i: [(trainer[r, : len(c)] + 0.25).tolist() for r, c in enumerate(completions)]
    groups = engine.generate(samples[:1], SamplingParams(n=2, max_new_tokens=4))
    stats = engine.stats()
    assert groups[0].policy_version == 2
    assert math.isclose(stats["rollout/logprob_abs_diff"], 0.25, abs_tol=1e-5)
    assert stats["rollout/encoder_calls"] == 1  # the image was encoded once, for the first rollout


def test_engine_from_a_run_config(load, fake_vllm):
    from vlgrpo.config import load_config
    from vlgrpo.models import LoadedModel

    model, processor = load("qwen2_5_vl")
    cfg = load_config(None, ["rollout.engine=vllm", "rollout.vllm.mm_input=pixels", "model.freeze_merger=false",
                             "data.max_prompt_length=300", "rollout.max_new_tokens=20"])  # fmt: skip
    lm = LoadedModel(model, processor, "qwen2_5_vl", "ckpt")
    engine = VLLMEngine.from_config(cfg, lm, VisionCache(model, processor), "qwen2_5")
    kw = engine.llm.kwargs
    assert kw["max_model_len"] == 320 and not kw["enable_mm_embeds"] and kw["enable_sleep_mode"]
    assert engine.mm_input == "pixels" and engine.push_visual and engine.sleep_level == 1
    assert engine.check_model is model


def test_engine_refuses_bad_settings(load):
    model, processor = load("qwen2_5_vl")
    with pytest.raises(ValueError, match="needs a VisionCache"):
        VLLMEngine(FakeLLM([]), processor, None, mm_input="embeds")
    with pytest.raises(ValueError, match="mm_input must be one of"):
        VLLMEngine(FakeLLM([]), processor, None, mm_input="image")


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None, reason="needs a CUDA GPU and vllm"
)
def test_vllm_greedy_matches_hf_and_logprobs_agree_after_sync(tiny_model_dir, samples):  # pragma: no cover - GPU
    from vlgrpo.models import load_model
    from vlgrpo.rollout.hf import HFEngine

    lm = load_model(tiny_model_dir("qwen2_5_vl"), device="cuda")
    cache = VisionCache(lm.model, lm.processor)
    engine = VLLMEngine.launch(tiny_model_dir("qwen2_5_vl"), lm.processor, cache, check_model=lm.model,
                               gpu_memory_utilization=0.2, max_model_len=1024,
                               llm_kwargs={"dtype": "float32", "enforce_eager": True})  # fmt: skip
    hf = HFEngine(lm.model, lm.processor, cache)
    greedy = SamplingParams(n=1, temperature=0, max_new_tokens=12)
    want = [g.completions[0].token_ids for g in hf.generate(samples[:4], greedy)]
    got = [g.completions[0].token_ids for g in engine.generate(samples[:4], greedy)]
    assert got == want
    with torch.no_grad():
        for p in lm.model.model.language_model.parameters():
            p.mul_(1.01)
    engine.update_weights(sync_params(lm.model), version=1)
    engine.generate(samples[:4], SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=0))
    assert engine.stats()["rollout/logprob_abs_diff"] < 1e-2
