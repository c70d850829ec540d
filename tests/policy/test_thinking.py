"""data.thinking and prompts that open <think>: the template's switch reaches the prompt, a completion that continues
an opened block is read, rewarded and scored as the whole turn, and SFT teaches only what follows the opened tag."""

import pytest

from vlgrpo.policy.prompt import build_prompt, continue_turn, opened_in_prompt
from vlgrpo.rewards import RewardContext, score
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.hf import HFEngine
from vlgrpo.types import InputError
from vlgrpo.vision_cache import VisionCache

USER = "<|im_start|>user\nHow many red shapes are there?<|im_end|>\n"
# The generation prompts of the released templates (their last lines): Qwen3.5 with thinking on (its default) and
# off, a Qwen3-VL Thinking checkpoint (always opens it), Qwen2.5-VL / Qwen3-VL Instruct (no think block)
ENDINGS = {
    "qwen3_5-on": (USER + "<|im_start|>assistant\n<think>\n", "<think>\n"),
    "qwen3_5-off": (USER + "<|im_start|>assistant\n<think>\n\n</think>\n\n", ""),
    "qwen3_vl-thinking": (USER + "<|im_start|>assistant\n<think>\n", "<think>\n"),
    "instruct": (USER + "<|im_start|>assistant\n", ""),
    "earlier-turn-thinks": (
        "<|im_start|>assistant\n<think>x</think>ok<|im_end|>\n" + USER + "<|im_start|>assistant\n",
        "",
    ),
}


@pytest.mark.parametrize("name", ENDINGS)
def test_what_the_generation_prompt_opens(name):
    prompt, opened = ENDINGS[name]
    assert opened_in_prompt(prompt) == opened


def test_the_switch_reaches_the_template_and_the_prompt_records_what_it_opened(load, samples):
    _, processor = load("qwen3_5")
    decode = processor.tokenizer.decode
    on, off, auto = (build_prompt(samples[0], processor, thinking=t) for t in ("on", "off", "auto"))
    assert decode(on.input_ids).endswith("<|im_start|>assistant\n<think>\n") and on.opened == "<think>\n"
    assert decode(off.input_ids).endswith("<think>\n\n</think>\n\n") and off.opened == ""
    assert auto.input_ids == on.input_ids  # the template's own default: thinking on
    _, plain = load("qwen2_5_vl")  # a template without the switch ignores it
    assert build_prompt(samples[0], plain, thinking="on").input_ids == build_prompt(samples[0], plain).input_ids


def test_a_completion_inside_the_opened_block_is_rewarded_as_the_whole_turn(load, samples):
    """The engine's text is the opened tag + what the model wrote, so the format reward and the answer's accuracy
    read it as <think>...</think><answer>...</answer>; the decoded completion alone (what scored 0 before) fails."""
    model, processor = load("qwen3_5")
    engine = HFEngine(model, processor, VisionCache(model, processor), answer_format="think_answer", thinking="on")
    group = engine.generate(samples[:1], SamplingParams(temperature=0, max_new_tokens=3))[0]
    written = processor.tokenizer.decode(group.completions[0].token_ids, skip_special_tokens=True)
    assert group.completions[0].text == "<think>\n" + written
    off = HFEngine(model, processor, VisionCache(model, processor), thinking="off")
    assert (
        not off.generate(samples[:1], SamplingParams(temperature=0, max_new_tokens=3))[0]
        .completions[0]
        .text.startswith("<think>")
    )

    ctx = RewardContext(answer_format="think_answer")
    sample = samples[0]
    continuation = f"I count the red shapes.</think><answer>{sample.answer}</answer>"
    whole = score(["<think>\n" + continuation], [sample], {"format": 1.0, "accuracy": 1.0}, ctx)
    alone = score([continuation], [sample], {"format": 1.0, "accuracy": 1.0}, ctx)
    assert whole.components["format"] == [1.0] and whole.components["accuracy"] == [1.0]
    assert alone.components["format"] == [0.0]


def test_sft_teaches_what_follows_the_opened_tag():
    target = "<think>I count two.</think><answer>2</answer>"
    assert continue_turn("<think>\n", target) == "I count two.</think><answer>2</answer>"
    assert (
        continue_turn("<think>\n", "<think>\nI count.</think><answer>2</answer>")
        == "I count.</think><answer>2</answer>"
    )
    assert continue_turn("", target) == target
    with pytest.raises(InputError, match="row 3: the prompt opens '<think>'.*data.answer_format=think_answer"):
        continue_turn("<think>\n", "<answer>2</answer>", "row 3: ")
