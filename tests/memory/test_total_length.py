"""rollout.max_total_length: resolved from the prompt budget, the turns and the crops at model.max_pixels when unset;
refused below one whole turn after the longest prompt; the planner's trajectory cut at it."""

import json

import pytest

from vlgrpo.config import ConfigError, load_config
from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.memory.from_config import plan_input_from_config, tool_notes, total_length

TOOLS = ["rollout.tools=[zoom_in]", "rollout.max_turns=3"]


def tiny_checkpoint(path, max_pixels: int = 28 * 28 * 64) -> str:
    """A checkpoint directory holding only the processor file `vlgrpo model init-tiny` writes: 14 px patches, 2x2
    merge, at most 64 image tokens."""
    path.mkdir(exist_ok=True)
    processor = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 3136}
    (path / "preprocessor_config.json").write_text(json.dumps({**processor, "max_pixels": max_pixels}))
    return str(path)


def test_one_turn_is_the_prompt_budget_plus_max_new_tokens():
    cfg = load_config("configs/tiny_grpo.yaml", ["model.name_or_path=/nonexistent"])  # no geometry is read
    assert total_length(cfg) == 256 + 40  # data.max_prompt_length + rollout.max_new_tokens: vLLM's old max_model_len


def test_three_turns_add_two_tool_responses_with_crops_at_max_pixels(tmp_path):
    """tiny_grpo: 256 prompt + 3 turns x 40 + 2 tool responses x (64 crop tokens + 24 markup + 64 text) = 680 (the
    markup of Qwen's released tokenizers: no tokenizer is given). A crop is at most
    max_pixels / (14 x 2)^2 = 50,176 / 784 = 64 tokens; smart_resize reaches that bound on a large square image."""
    ckpt = tiny_checkpoint(tmp_path / "tiny")
    cfg = load_config("configs/tiny_grpo.yaml", [f"model.name_or_path={ckpt}", *TOOLS])
    assert total_length(cfg) == 256 + 3 * 40 + 2 * (64 + 24 + 64) == 680
    assert ProcessorGeometry(max_pixels=50176).num_image_tokens(2000, 2000) == 64  # the bound is reached
    wider = load_config("configs/tiny_grpo.yaml", [f"model.name_or_path={ckpt}", *TOOLS, "model.max_pixels=100352"])
    assert total_length(wider) == 256 + 3 * 40 + 2 * (128 + 24 + 64)  # model.max_pixels overrides the checkpoint's
    qwen3 = ProcessorGeometry(patch_size=16, max_pixels=32 * 32 * 100)  # the engine hands in its processor's
    assert total_length(cfg, qwen3) == 256 + 3 * 40 + 2 * (100 + 24 + 64)
    assert total_length(load_config("configs/tiny_grpo.yaml", [*TOOLS, "rollout.max_total_length=400"])) == 400


def test_the_released_geometry_bounds_a_crop_at_16384_tokens(tmp_path):
    cfg = load_config(None, [f"model.name_or_path={tmp_path}", *TOOLS])  # a directory without processor files
    assert total_length(cfg) == 1024 + 3 * 128 + 2 * (12845056 // 28**2 + 24 + 64) == 1024 + 384 + 2 * (16384 + 88)


@pytest.mark.parametrize("value", [1151, 100])
def test_a_total_length_without_room_for_one_turn_is_refused(value):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"rollout.max_total_length={value}"])
    assert str(e.value).startswith(f"config key 'rollout.max_total_length' = {value} leaves no room for a turn")
    assert "data.max_prompt_length + rollout.max_new_tokens = 1024 + 128 = 1152, or null" in str(e.value)


def test_one_whole_turn_after_the_longest_prompt_is_accepted():
    assert load_config(None, ["rollout.max_total_length=1152"]).rollout.max_total_length == 1152
    assert load_config(None, []).rollout.max_total_length is None


def test_the_plan_cuts_the_trajectory_at_max_total_length():
    """Qwen2.5-VL-7B, a 448 px image (256 tokens) + 64 text tokens = 320 prompt tokens; 3 turns of 128 and 2 tool
    responses of 256 + 24 + 64 = 1,072 tokens after it, cut at 700 - 320 = 380."""
    base = ["model.name_or_path=qwen2.5-vl-7b", *TOOLS, "data.max_prompt_length=512"]
    whole = plan_input_from_config(load_config(None, base))
    assert whole.completion_tokens == 3 * 128 + 2 * (256 + 24 + 64) == 1072
    assert "capped" not in tool_notes(load_config(None, base), whole)[0]
    cfg = load_config(None, [*base, "rollout.max_total_length=700"])
    cut = plan_input_from_config(cfg)
    assert cut.completion_tokens == 700 - (64 + 256) == 380
    assert tool_notes(cfg, cut) == [
        "rollout.max_turns=3: 380 tokens after the prompt planned (3 x 128 sampled + 2 tool responses of up to 256 "
        "crop tokens + 24 markup + 64 text each, capped at rollout.max_total_length=700 - 320 prompt tokens); a row "
        "with crops runs whole in the update"
    ]
    roomy = load_config(None, [*base, "rollout.max_total_length=2000"])
    assert plan_input_from_config(roomy).completion_tokens == 1072  # 320 + 1,072 fit: nothing to cut
