"""Multi-turn rollouts with the zoom-in tool on the real vLLM engine (vLLM's CPU build, `make test-vllm`): a tiny
Qwen2.5-VL taught to call the tool (`tool_model.py`) decodes greedy trajectories through vLLM (each turn continued
from the trajectory's token ids, its crops sent as image embeddings) that equal the HF engine's token for token —
the turns, the tool-response tokens, the crops' bytes, the finish reasons; the earlier turns come from vLLM's prefix
cache; each crop is encoded once. Its sampled trajectories, saved as messages, replay with the processor's own chat
template to the ids vLLM was fed."""

import os

import pytest
from chat_replay import replay_groups

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


@pytest.fixture(scope="module")
def caller(tool_caller_dir):
    """(the taught model, its processor, a vLLM engine on it), launched once for the module."""
    from vlgrpo.rollout.vllm.engine import VLLMEngine

    lm = load_model(tool_caller_dir)
    model, processor = lm.model.eval(), lm.processor
    engine = VLLMEngine.launch(
        tool_caller_dir,
        processor,
        VisionCache(model, processor),
        prompt=PromptSettings(box_format="plain"),
        max_model_len=2048,
        gpu_memory_utilization=0.5,
        llm_kwargs=ENGINE_KWARGS,
        limit_mm_per_prompt=with_tool_images({"image": 1, "video": 0}, 3),
    )
    return model, processor, engine


def test_greedy_trajectories_equal_the_hf_engines(caller, samples):
    model, processor, engine = caller
    greedy = SamplingParams(completions_per_prompt=2, temperature=0, max_new_tokens=100)
    hf = ToolRollout(HFEngine(model, processor, VisionCache(model, processor), box_format="plain"), ("zoom_in",), 3)
    want = hf.generate(samples[:3], greedy)
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
            assert b.text == a.text and b.turns == a.turns and b.prompt_messages == a.prompt_messages
    first = want[0].completions[0]
    assert len(first.images) >= 1 and first.turns[1]["content"][1] == {"type": "image", "image": 0}  # a crop came back
    print("vLLM multi-turn:", stats)
    assert stats["tools/calls_per_sample"] >= 1 / 3
    # the turns after the first: their prompts begin with the earlier turns, whose full blocks vLLM reuses
    assert stats["rollout/prefix_cache_hit_tokens"] >= 32
    # the 3 prompts' images and each distinct crop, one encoder call each (the crop of the same box is one entry)
    assert stats["rollout/encoder_calls"] <= 3 + len({bytes(i) for g in got for c in g.completions for i in c.images})


def test_saved_messages_replay_with_the_chat_template_to_the_ids_vllm_was_fed(caller, samples):
    """Issue 59 on vLLM: sampled trajectories of the taught model, saved as `trajectory_messages`, replay with the
    processor's own `apply_chat_template(messages[:k], tools=...)` and the processor over the saved images to the ids
    vLLM was fed each turn; where a sampled turn is not the tokenizer's encoding of its text, the turns after it are
    compared as text (`chat_replay`)."""
    _, processor, engine = caller
    tools = ToolRollout(engine, ("zoom_in",), 3)
    groups = [
        g
        for temperature in (0.3, 0.6, 1.0)  # the lower, the more calls are well formed and get crops
        for g in tools.generate(
            samples[:4], SamplingParams(completions_per_prompt=4, temperature=temperature, max_new_tokens=100, seed=5)
        )
    ]
    done = replay_groups(processor, groups, tools.schemas)
    print("vLLM replay:", done)  # seen: 86 turns, 82 id-compared, 8 of them after a crop, 39 after turn 1
    assert done.ids >= 60 and done.after_crop >= 5 and done.later >= 25
