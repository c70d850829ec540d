"""vLLM backend on the CPU without vLLM: request building, name mapping and output handling, and the engine's
calls against a stand-in that enforces vLLM's sleep-mode and weight-reload rules (fails on a wrong order).

The real engine (vLLM's CPU build) runs in tests/rollout/test_vllm_engine.py, marked `vllm`."""

import math
import sys
import types
from types import SimpleNamespace as NS

import pytest
from PIL import Image

from vlgrpo.models import is_visual
from vlgrpo.policy.prompt import PromptSettings, build_prompt
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.vllm.engine import VLLMEngine, build_request, engine_prompt_ids
from vlgrpo.rollout.vllm.sampling import PLACEHOLDER_BIAS, request_seeds, sampling_kwargs, to_completions
from vlgrpo.rollout.vllm.weights import vllm_param_name
from vlgrpo.vision_cache import VisionCache


def test_weight_names_map_to_checkpoint_names():
    cases = {
        "model.language_model.layers.0.self_attn.q_proj.weight": "model.language_model.layers.0.self_attn.q_proj.weight",  # noqa: E501
        "module.model.visual.blocks.0.attn.qkv.weight": "model.visual.blocks.0.attn.qkv.weight",
        "base_model.model.model.language_model.layers.1.mlp.up_proj.base_layer.weight": "model.language_model.layers.1.mlp.up_proj.weight",  # noqa: E501
        "base_model.model.lm_head.modules_to_save.default.weight": "lm_head.weight",
        "model.layers.0._checkpoint_wrapped_module.mlp.down_proj.weight": "model.layers.0.mlp.down_proj.weight",
        "_orig_mod.model.visual.merger.mlp.0.bias": "model.visual.merger.mlp.0.bias",
    }
    for hf, expected in cases.items():
        assert vllm_param_name(hf) == expected
    for skipped in (
        "base_model.model.model.language_model.layers.1.mlp.up_proj.lora_A.default.weight",
        "base_model.model.lm_head.original_module.weight",
    ):
        assert vllm_param_name(skipped) is None
    assert is_visual("model.visual.merger.mlp.0.bias") and is_visual("visual.blocks.0.norm1.weight")
    assert not is_visual("model.language_model.layers.0.mlp.up_proj.weight")


def test_sampling_kwargs_seeds_and_requests(load, samples):
    model, processor = load("qwen2_5_vl")
    params = SamplingParams(completions_per_prompt=8, temperature=0.9, top_k=0, max_new_tokens=16, stop=["</answer>"])
    kw = sampling_kwargs(params, [9, 12], seed=3)
    assert kw["n"] == 8 and kw["top_k"] == -1 and kw["max_tokens"] == 16 and kw["stop"] == ["</answer>"]
    assert kw["logit_bias"] == {9: PLACEHOLDER_BIAS, 12: PLACEHOLDER_BIAS} and kw["logprobs"] == 0 and kw["seed"] == 3
    greedy = SamplingParams(completions_per_prompt=4, temperature=0)
    assert sampling_kwargs(greedy, [])["n"] == 1  # vLLM greedy needs n=1
    seeds = request_seeds(5, 4)
    assert len(set(seeds)) == 4 and seeds == request_seeds(5, 4) and request_seeds(None, 2) == [None, None]

    image_id = model.config.image_token_id
    prompt = build_prompt(samples[0], processor)
    assert prompt.input_ids.count(image_id) == 16  # the trainer's ids hold the expanded run (112 px image)
    ids = engine_prompt_ids(prompt.input_ids, image_id)
    assert ids.count(image_id) == 1 and len(ids) == len(prompt.input_ids) - 15
    assert [i for i in ids if i != image_id] == [i for i in prompt.input_ids if i != image_id]
    feats = VisionCache(model, processor).get([samples[0].image])[0]
    req = build_request(prompt, image_id, feats, "embeds")
    image = req["multi_modal_data"]["image"]
    assert req["prompt_token_ids"] == ids
    assert image["image_embeds"].shape == (16, 128) and image["image_grid_thw"].tolist() == [[1, 8, 8]]
    req = build_request(prompt, image_id, None, "pixels")
    assert isinstance(req["multi_modal_data"]["image"], Image.Image) and len(req["multi_modal_uuids"]["image"][0]) == 64
    with pytest.raises(ValueError, match="mm_input must be one of embeds, pixels"):
        build_request(prompt, image_id, feats, "pil")


def _out(ids, logps=None, finish="stop", text="t"):
    lps = [{t: NS(logprob=lp)} for t, lp in zip(ids, logps)] if logps else None
    return NS(token_ids=ids, logprobs=lps, finish_reason=finish, text=text)


def test_outputs_become_completions_and_placeholders_are_cut():
    output = NS(outputs=[_out([5, 6, 2], [-0.1, -0.2, -0.3]), _out([7, 12, 8], [-1.0, -2.0, -3.0], "length")])
    comps, bad = to_completions(output, SamplingParams(completions_per_prompt=2), {12}, decode=lambda ids: f"dec{ids}")
    assert bad == 1
    fields = [(c.token_ids, c.logprobs, c.finish_reason, c.text) for c in comps]
    assert fields == [([5, 6, 2], [-0.1, -0.2, -0.3], "stop", "dec[5, 6, 2]"), ([7], [-1.0], "placeholder", "dec[7]")]
    cut, _ = to_completions(NS(outputs=[_out([1, 2])]), SamplingParams(stop=["</a>"]), set(), lambda ids: "x</a>y")
    assert cut[0].text == "x"  # decoded by our tokenizer and cut at the stop string, as the HF engine does
    three = SamplingParams(completions_per_prompt=3, temperature=0)
    greedy, _ = to_completions(NS(outputs=[_out([4])]), three, set(), str)
    assert [c.token_ids for c in greedy] == [[4], [4], [4]]
    # non-finite log-probs (vLLM 0.32's CPU Gated DeltaNet on Qwen3.5) stop the run instead of being trained on
    with pytest.raises(RuntimeError, match="NaN log-probs.*rollout.engine=hf"):
        to_completions(NS(outputs=[_out([3, 4], [-0.5, float("nan")])]), SamplingParams(), set(), str)
    masked, _ = to_completions(NS(outputs=[_out([3], [-math.inf])]), SamplingParams(), set(), str)
    assert masked[0].logprobs == [-math.inf]  # a token at -inf is a masked one, not a failure


class StrictLLM:
    """Stands in for vllm.LLM and enforces the rules of vLLM's sleep mode and in-place weight reload, as vLLM
    documents them (docs/features/sleep_mode.md) and its executor implements them: sleep only when fully awake;
    wake each allocation once (a tag that is already awake is refused, memory is never mapped twice); weights wake
    before the KV cache; generation needs everything awake; `reload_weights` needs the weights awake. Any breach
    raises, so a wrong call order fails the test."""

    def __init__(self, completions=(), prompt_len=None, **kwargs):
        self.kwargs, self.completions, self.prompt_len = kwargs, list(completions), prompt_len
        self.image_token_id = None  # the tests set it: vLLM reads it from the model config
        self.asleep, self.calls, self.requests, self.loaded, self.params = set(), [], [], [], []
        self.llm_engine = NS(
            reset_encoder_cache=lambda: self.calls.append("reset_encoder_cache"),
            model_config=NS(hf_config=NS(tie_word_embeddings=True), hf_text_config=NS()),
        )

    def _rule(self, ok: bool, why: str):
        if not ok:
            raise RuntimeError(f"vLLM rule broken: {why} (calls so far: {self.calls})")

    def generate(self, requests, params, use_tqdm=False):
        self._rule(not self.asleep, f"generate while {sorted(self.asleep)} asleep")
        self._rule(isinstance(params, list) and len(params) == len(requests), "one SamplingParams per request")
        self.calls.append("generate")
        self.requests += requests
        self.params += params
        return [
            NS(outputs=[_out(c) for c in self.completions], prompt_token_ids=[0] * self._expanded(r)) for r in requests
        ]

    def _expanded(self, request) -> int:
        """Prompt length after vLLM's placeholder expansion: every image pad becomes the image's N tokens."""
        if self.prompt_len:
            return self.prompt_len
        image = request["multi_modal_data"]["image"]
        n = image["image_embeds"].shape[0] if isinstance(image, dict) else 16
        pads = request["prompt_token_ids"].count(self.image_token_id)
        return len(request["prompt_token_ids"]) + pads * (n - 1)

    def collective_rpc(self, method, kwargs=None):
        if method == "reload_weights":
            self._rule("weights" not in self.asleep, "reload_weights while the weights sleep")
            self._rule(kwargs["is_checkpoint_format"], "weights pushed in checkpoint format")
            self.loaded += [name for name, _ in kwargs["weights_iterator"]]
            self.calls.append("reload_weights")
        else:
            self.calls.append(getattr(method, "__name__", method))
        return [None]

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def sleep(self, level=1):
        self._rule(not self.asleep, "sleep while already (partly) asleep")
        self.asleep = {"weights", "kv_cache"}
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        tags = list(tags) if tags else ["weights", "kv_cache"]
        self._rule(all(t in self.asleep for t in tags), f"wake {tags} but only {sorted(self.asleep)} sleep")
        self._rule(
            not ("kv_cache" in tags and "weights" in self.asleep and "weights" not in tags),
            "the KV cache woken before the weights",
        )
        self.asleep -= set(tags)
        self.calls.append(("wake_up", tags))


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: NS(kw=kw)
    module.LLM = StrictLLM
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # launch() sets it; undone after the test
    return module


def test_engine_follows_vllm_sleep_and_reload_rules_across_steps(load, samples, fake_vllm):
    model, processor = load("qwen2_5_vl")
    cache = VisionCache(model, processor)
    engine = VLLMEngine.launch("ckpt", processor, cache, sleep_level=1, push_visual=True, gpu_memory_utilization=0.3)
    llm = engine.llm
    assert llm.kwargs["enable_prefix_caching"] and llm.kwargs["enable_mm_embeds"] and engine.tied_embeddings
    assert llm.kwargs["limit_mm_per_prompt"] == {"image": 1, "video": 0} and llm.kwargs["gpu_memory_utilization"] == 0.3
    llm.completions, llm.image_token_id = [[30, 31], [32]], model.config.image_token_id
    weights = list(model.state_dict().items())
    for step in range(1, 4):  # generate -> sleep -> (update) -> generate ... as the trainer does
        groups = engine.generate(samples[:2], SamplingParams(completions_per_prompt=2, max_new_tokens=4, seed=step))
        assert llm.asleep == {"weights", "kv_cache"} and groups[0].policy_version == step - 1
        language = [(n, p) for n, p in weights if ".visual." not in n] if step == 1 else weights
        engine.update_weights(language, version=step)
    assert llm.calls[:8] == [
        "generate",
        ("sleep", 1),
        ("wake_up", ["weights"]),
        "reload_weights",
        "_refresh_tied_lm_head",
        "reset_prefix_cache",
        "reset_encoder_cache",
        ("wake_up", ["kv_cache"]),
    ]
    assert llm.loaded and any(is_visual(n) for n in llm.loaded) and engine.stats()["rollout/weight_syncs"] == 3
    seeds = [p.kw["seed"] for p in llm.params]
    assert len(set(seeds)) == len(seeds) == 6  # one seed per request, new ones every step
    assert llm.requests[0]["prompt_token_ids"].count(model.config.image_token_id) == 1
    # the order the engine used before this fix breaks the rules: the weights woken, then everything again
    engine.wake_up()
    assert llm.calls[-1] == ("wake_up", ["kv_cache"]) and not llm.asleep
    llm.sleep(1)
    llm.wake_up(tags=["weights"])
    with pytest.raises(RuntimeError, match="wake .* but only"):
        llm.wake_up()


def test_engine_refuses_a_prompt_length_that_differs_from_the_trainers(load, samples, fake_vllm):
    model, processor = load("qwen2_5_vl")
    engine = VLLMEngine.launch("ckpt", processor, VisionCache(model, processor))
    engine.llm.completions, engine.llm.prompt_len = [[30]], 67  # an image expanded twice, as before the fix
    with pytest.raises(RuntimeError, match="prompt tokens, the trainer has"):
        engine.generate(samples[:1], SamplingParams(completions_per_prompt=1, max_new_tokens=2))


def test_engine_from_a_run_config(load, fake_vllm):
    from vlgrpo.config import load_config
    from vlgrpo.models import LoadedModel

    model, processor = load("qwen2_5_vl")
    cfg = load_config(
        None,
        [
            "rollout.engine=vllm",
            "rollout.vllm.mm_input=pixels",
            "model.freeze_merger=false",
            "data.max_prompt_length=300",
            "rollout.max_new_tokens=20",
            "rollout.vllm.engine_kwargs={'enforce_eager': True, 'block_size': 16}",
        ],
    )
    lm = LoadedModel(model, processor, "qwen2_5_vl", "ckpt")
    engine = VLLMEngine.from_config(cfg, lm, VisionCache(model, processor), PromptSettings.from_config(cfg, "qwen2_5"))
    kw = engine.llm.kwargs
    assert kw["max_model_len"] == 320 and not kw["enable_mm_embeds"] and kw["enable_sleep_mode"]
    assert kw["enforce_eager"] and kw["block_size"] == 16 and kw["dtype"] == "float32"
    size = processor.image_processor.size  # vLLM's own processor resizes exactly as the trainer's
    assert kw["mm_processor_kwargs"] == {"min_pixels": size["shortest_edge"], "max_pixels": size["longest_edge"]}
    assert engine.mm_input == "pixels" and engine.push_visual and engine.sleep_level == 1


def test_engine_refuses_bad_settings(load):
    model, processor = load("qwen2_5_vl")
    with pytest.raises(ValueError, match="needs a VisionCache"):
        VLLMEngine(StrictLLM([]), processor, None, mm_input="embeds")
    with pytest.raises(ValueError, match="mm_input must be one of"):
        VLLMEngine(StrictLLM([]), processor, None, mm_input="image")


def test_both_engines_offer_every_member_of_the_protocol_and_vllm_says_what_it_lacks(load, fake_vllm):
    """The multi-turn members (`RolloutEngine`: ids continued, kept KV, limits) on both engines: ToolRollout reads
    them without probing; vLLM keeps no KV, bounds the context and the images."""
    from vlgrpo.rollout.base import RolloutEngine
    from vlgrpo.rollout.hf import HFEngine
    from vlgrpo.rollout.turns import ToolRollout

    model, processor = load("qwen2_5_vl")
    cache = VisionCache(model, processor)
    vllm = VLLMEngine.launch("ckpt", processor, cache, max_model_len=512, limit_mm_per_prompt={"image": 3})
    hf = HFEngine(model, processor, cache)
    members = [n for n in dir(RolloutEngine) if not n.startswith("_")] + list(RolloutEngine.__annotations__)
    assert {"generate_prompts", "continue_prompts", "keeps_turns", "last_kv", "max_images"} <= set(members)
    for engine in (hf, vllm):
        assert [n for n in members if not hasattr(engine, n)] == []
    assert (vllm.keeps_turns, vllm.last_kv, vllm.max_model_len, vllm.max_images) == (False, [], 512, 3)
    assert (hf.max_model_len, hf.max_images, hf.last_kv) == (None, None, [])
    with pytest.raises(NotImplementedError, match="give each turn's prompt to generate_prompts"):
        vllm.continue_prompts([], [], [], SamplingParams())
    with pytest.raises(ValueError, match="keeps no completion's KV"):
        vllm.generate_prompts([], [], SamplingParams(), keep_kv=True)
    tools = ToolRollout(vllm, ("zoom_in",), 3)
    assert (tools.reuse, tools.max_total_length, tools.max_images) == (False, 512, 3)


def test_what_a_runs_config_hands_vllm(tiny_model_dir):
    """`launch_args`, what reaches `vllm.LLM`: colocated runs turn the multimodal processor cache off (it keeps every
    image's embeddings next to the trainer) and empty vLLM's caches after each rollout; a hybrid model asks for
    prefix caching of its linear-attention state at block boundaries; rollout.vllm.engine_kwargs overrides each."""
    from vlgrpo.config import load_config
    from vlgrpo.models import load_model
    from vlgrpo.rollout.vllm.settings import launch_args

    dense, hybrid = load_model(tiny_model_dir()), load_model(tiny_model_dir("qwen3_5"))
    colocated = load_config(None, ["rollout.engine=vllm"])
    args = launch_args(colocated, dense, PromptSettings())
    assert args["llm_kwargs"] == {"mm_processor_cache_gb": 0, "dtype": "float32"} and args["release_mm_caches"]
    hybrid_args = launch_args(colocated, hybrid, PromptSettings())["llm_kwargs"]
    assert hybrid_args == {"mm_processor_cache_gb": 0, "mamba_cache_mode": "align", "dtype": "float32"}
    split = load_config(None, ["rollout.engine=vllm"])
    split.rollout.placement = "split"  # (the config check wants GPUs for vLLM's worker)
    args = launch_args(split, dense, PromptSettings())
    assert args["llm_kwargs"] == {"dtype": "float32"} and not args["release_mm_caches"]
    own = load_config(None, ["rollout.engine=vllm", "rollout.vllm.engine_kwargs={mm_processor_cache_gb: 2}"])
    assert launch_args(own, dense, PromptSettings())["llm_kwargs"]["mm_processor_cache_gb"] == 2
