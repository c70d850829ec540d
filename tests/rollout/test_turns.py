"""Multi-turn rollouts with the zoom-in tool on the HF engine (`rollout/turns.py`), the model's turns scripted so the
tool is called: the trajectory's tokens, its tool mask and crop, the next turn's prompt (its ids, the crop's image
tokens and vision-cache source), and that prompt's prefill (cached features of the original and the crop) against
the transformers model's own forward on pixels over the whole interleaved sequence; and the saved conversation
(`trajectory_messages`), which the processor's own chat template replays to the ids each turn was fed."""

from __future__ import annotations

import io
import math
from dataclasses import replace

import pytest
from chat_replay import Replayed, replay, replay_groups
from PIL import Image
from pixel_reference import pixel_logits

from vlgrpo.data.images import load_image
from vlgrpo.data.prompts import TOOL_RESPONSE, instruction
from vlgrpo.models import load_model
from vlgrpo.policy.prompt import build_prompt
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.hf import HFEngine, decode_loop
from vlgrpo.rollout.sampling import Row
from vlgrpo.rollout.tools.table import tool_schemas
from vlgrpo.rollout.turns import ToolRollout, crop_names, tool_response_role, trajectory_messages
from vlgrpo.trainer.batch import over_turn_mask
from vlgrpo.types import RolloutGroup
from vlgrpo.vision_cache import VisionCache

CALL = '<think>small</think><tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 56, 56]}}'
ANSWER = "<think>red</think><answer>red</answer>"
OPEN, CLOSE = {"type": "text", "text": "<tool_response>\n"}, {"type": "text", "text": "\n</tool_response>"}


class Scripted:
    """An HF engine `decode` that writes the given texts turn after turn (every row of a call the same) and keeps
    each call's last-position logits."""

    def __init__(self, tokenizer, texts: list[str]):
        self.tokenizer, self.texts, self.lasts = tokenizer, list(texts), []

    def __call__(self, model, last, cache, next_pos, mask, run):
        self.lasts.append(last.clone())
        ids = self.tokenizer(self.texts.pop(0), add_special_tokens=False)["input_ids"]
        g = run.params.completions_per_prompt
        return [Row(list(ids), [-0.5] * len(ids), "stop") for _ in range(last.shape[0] * g)]


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_a_zoom_call_returns_the_crop_and_the_next_turn_sees_it(load, samples, arch):
    model, processor = load(arch, spread_by=0.1)
    tok = processor.tokenizer
    script = Scripted(tok, [CALL + "</tool_call>", ANSWER])
    engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain", decode=script)
    tools = ToolRollout(engine, ("zoom_in",), max_turns=3)
    sample = samples[0]
    (group,) = tools.generate([sample], SamplingParams(completions_per_prompt=2, temperature=1.0, max_new_tokens=64))
    c = group.completions[0]
    # the crop: plain pixels [0, 0, 56, 56] of the original image, as PNG
    crop = Image.open(io.BytesIO(c.images[0]))
    assert len(c.images) == 1 and crop.size == (56, 56)
    assert list(crop.getdata()) == list(load_image(sample.image).crop((0, 0, 56, 56)).getdata())
    # tokens: turn 1, the tool response (masked), turn 2
    turn1 = tok(CALL + "</tool_call>", add_special_tokens=False)["input_ids"]
    grid = engine.geometry.grid_thw(56, 56)
    pads = grid[1] * grid[2] // engine.geometry.merge_size**2
    response = tok(
        TOOL_RESPONSE.format("<|vision_start|>" + "<|image_pad|>" * pads + "<|vision_end|>"), add_special_tokens=False
    )["input_ids"]
    turn2 = tok(ANSWER, add_special_tokens=False)["input_ids"]
    assert c.token_ids == turn1 + response + turn2
    assert c.tool_mask == [0] * len(turn1) + [1] * len(response) + [0] * len(turn2)
    assert [math.isnan(x) for x in c.logprobs] == [bool(m) for m in c.tool_mask]
    assert c.text == CALL + "</tool_call>" + ANSWER and c.finish_reason == "stop"
    # the tiny templates render a `tool` message as `<|im_start|>tool`: the crop goes back as a user <tool_response>
    assert [t["role"] for t in c.turns] == ["assistant", "user", "assistant"]
    assert c.turns[1]["content"] == [OPEN, {"type": "image", "image": 0}, CLOSE]
    stats = tools.stats()
    assert stats["tools/calls_per_sample"] == 1 and stats["tools/turns"] == 2 and stats["tools/errors"] == 0
    assert stats["tools/crop_area"] == pytest.approx(56 * 56 / (sample.image_size[0] * sample.image_size[1]))
    # the second turn's prefill: cached features of the original and the crop, positions over the whole sequence,
    # equal to the model's own forward on pixels (one prefill per trajectory: two rows, one crop encoded once)
    ref = pixel_logits(model, processor, group.prompt_ids + turn1 + response, [load_image(sample.image), crop])[-1]
    assert len(script.lasts) == 2 and script.lasts[1].shape[0] == 2
    diff = float((script.lasts[1][0] - ref).abs().max())
    print(arch, "continuation prefill vs pixel forward", diff)
    assert diff <= 1e-5


def test_errors_go_back_as_text_and_the_turn_cap_ends_a_trajectory(load, samples):
    model, processor = load("qwen2_5_vl", spread_by=0.1)
    bad = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [50, 50, 10, 10]}}</tool_call>'
    script = Scripted(processor.tokenizer, [bad, CALL + "</tool_call>"])
    engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain", decode=script)
    tools = ToolRollout(engine, ("zoom_in",), max_turns=2)
    (group,) = tools.generate(samples[:1], SamplingParams(completions_per_prompt=1, max_new_tokens=64))
    c = group.completions[0]
    assert c.finish_reason == "max_turns" and c.images == []  # the second call was never answered
    error = c.turns[1]["content"][1]["text"]
    assert error.startswith("image_zoom_in_tool:") and tools.stats()["tools/errors"] == 1
    assert processor.tokenizer.decode(c.token_ids).count(
        "<tool_response>"
    ) == 1 and error in processor.tokenizer.decode(c.token_ids)


def test_a_close_tag_without_its_call_is_an_error_turn_not_a_crash(load, samples):
    """A turn stopped at `</tool_call>` with no `<tool_call>` before it (a tiny model taught to call wrote one) gets an
    error turn telling the model the form; before the fix the rollout raised AttributeError on the missing call."""
    model, processor = load("qwen2_5_vl", spread_by=0.1)
    script = Scripted(processor.tokenizer, ['{"bbox_2d": [0, 0, 9, 9]}</tool_call>', ANSWER])
    engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain", decode=script)
    tools = ToolRollout(engine, ("zoom_in",), max_turns=3)
    (group,) = tools.generate(samples[:1], SamplingParams(completions_per_prompt=1, max_new_tokens=64))
    c = group.completions[0]
    assert [t["role"] for t in c.turns] == ["assistant", "user", "assistant"] and c.images == []
    assert c.turns[1]["content"][1]["text"].startswith("</tool_call> without its opening tag; write <tool_call>")
    assert c.finish_reason == "stop" and tools.stats()["tools/errors"] == 1


def test_a_crop_the_conversation_has_no_room_for_is_an_error_turn(load, samples):
    """An engine's image limit (vLLM's limit_mm_per_prompt, `max_images`) full: the tool's image is not sent (the
    engine would refuse the request) and the model reads why instead."""
    model, processor = load("qwen2_5_vl", spread_by=0.1)
    script = Scripted(processor.tokenizer, [CALL + "</tool_call>", ANSWER])
    engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain", decode=script)
    tools = ToolRollout(engine, ("zoom_in",), max_turns=3)
    tools.max_images = 1  # the sample's own image fills it
    (group,) = tools.generate(samples[:1], SamplingParams(completions_per_prompt=1, max_new_tokens=64))
    c = group.completions[0]
    assert c.images == [] and c.finish_reason == "stop" and tools.stats()["tools/errors"] == 1
    assert c.turns[1]["content"] == [
        OPEN,
        {"type": "text", "text": "Error: the tool returned 1 image(s), but the conversation has room for 0 more"},
        CLOSE,
    ]


def test_the_length_budget_ends_a_trajectory_before_a_turn_that_could_pass_it(load, samples):
    """max_total_length: a call whose response and one more turn would not fit ends the trajectory
    ("max_total_length", counted; over-turn masking treats it as the turn cap), the crop never cut."""
    model, processor = load("qwen2_5_vl", spread_by=0.1)
    tok = processor.tokenizer
    script = Scripted(tok, [CALL + "</tool_call>", ANSWER])
    engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain", decode=script)
    prompt = len(build_prompt(samples[0], processor, engine.geometry, tools=tool_schemas(("zoom_in",))).input_ids)
    turn1 = len(tok(CALL + "</tool_call>", add_special_tokens=False)["input_ids"])
    grid = engine.geometry.grid_thw(56, 56)
    response = len(
        tok(TOOL_RESPONSE.format("<|vision_start|>" + "<|image_pad|>" * (grid[1] * grid[2] // 4) + "<|vision_end|>"))[
            "input_ids"
        ]
    )
    fits = prompt + turn1 + response + 64  # the next turn's prompt and its max_new_tokens
    for budget, reason in [(fits, "stop"), (fits - 1, "max_total_length")]:
        script.texts = [CALL + "</tool_call>", ANSWER]
        tools = ToolRollout(engine, ("zoom_in",), max_turns=3, max_total_length=budget)
        (group,) = tools.generate(samples[:1], SamplingParams(completions_per_prompt=1, max_new_tokens=64))
        c = group.completions[0]
        assert c.finish_reason == reason and len(c.images) == (reason == "stop")
        assert tools.stats()["tools/over_length"] == (reason != "stop")
    assert over_turn_mask([RolloutGroup(samples[0], group.prompt_ids, [c])]).tolist() == [True]


def test_without_a_call_a_completion_is_the_engines_own(load, samples):
    model, processor = load("qwen2_5_vl", spread_by=0.1)
    engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain")
    tools = ToolRollout(engine, ("zoom_in",), max_turns=3)
    params = SamplingParams(completions_per_prompt=2, temperature=1.0, max_new_tokens=8, seed=0)
    groups = tools.generate(samples[:2], params)
    for g in groups:
        for c in g.completions:
            assert c.tool_mask is None and c.turns == [] and c.images == []
    assert "image_zoom_in_tool" in processor.tokenizer.decode(groups[0].prompt_ids)  # the schema is in the prompt
    assert tools.stats()["tools/calls_per_sample"] == 0 and tools.stats()["tools/turns"] == 1


def _kept_against_whole(model, processor, samples, params: SamplingParams) -> tuple[list, dict, dict]:
    """Tool rollouts of `samples` with each trajectory's state kept from turn to turn and with every turn prefilled
    whole -> (the kept run's groups, both runs' stats); asserts the same tokens, tool masks and crops, log-probs to
    1e-5, and that some rows called the tool."""
    runs = {}
    for reuse in (False, True):
        engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain")
        tools = ToolRollout(engine, ("zoom_in",), max_turns=3, reuse_turns=reuse)
        assert tools.reuse is reuse
        runs[reuse] = tools.generate(samples, params), tools.stats()
    (whole, whole_stats), (kept, kept_stats) = runs[False], runs[True]
    pairs = [(a, b) for ga, gb in zip(whole, kept) for a, b in zip(ga.completions, gb.completions)]
    assert all(a.token_ids == b.token_ids and a.tool_mask == b.tool_mask and a.images == b.images for a, b in pairs)
    gap = max(abs(x - y) for a, b in pairs for x, y in zip(a.logprobs, b.logprobs) if not math.isnan(x))
    print(f"prefill {whole_stats['rollout/prefill_tokens']} -> {kept_stats['rollout/prefill_tokens']}, gap {gap:.1e}")
    assert gap <= 1e-5 and kept_stats["tools/calls_per_sample"] > 0
    return whole, whole_stats, kept_stats


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_turns_continued_from_their_kv_equal_turns_prefilled_whole(tool_caller_dir, samples, temperature):
    """The HF engine keeps each trajectory's KV from turn to turn (a turn prefills only the tool response and what
    follows it): the same tokens and log-probs (1e-5) as prefilling every turn's prompt whole, on the tiny model taught
    to call the tool, with far fewer prefill tokens."""
    lm = load_model(tool_caller_dir)
    params = SamplingParams(completions_per_prompt=3, temperature=temperature, max_new_tokens=100, seed=3)
    whole, whole_stats, kept_stats = _kept_against_whole(lm.model.eval(), lm.processor, samples[:4], params)
    # whole: every turn's prompt, i.e. the prompt, then for each tool response the sequence up to its end
    ends = [
        len(g.prompt_ids) + e
        for g in whole
        for c in g.completions
        for e in range(1, len(c.tool_mask or []) + 1)
        if c.tool_mask[e - 1] and (e == len(c.tool_mask) or not c.tool_mask[e])
    ]
    assert whole_stats["rollout/prefill_tokens"] == sum(len(g.prompt_ids) for g in whole) + sum(ends)
    assert kept_stats["rollout/prefill_tokens"] < whole_stats["rollout/prefill_tokens"] / 2


def test_a_hybrid_models_turns_continue_its_gated_deltanet_and_attention_state(tiny_model_dir, samples):
    """Qwen3.5 (#59 item 6): a trajectory's next turn continues its attention layers' keys and values and its Gated
    DeltaNet layers' conv and recurrent states (it used to re-prefill every turn whole): the same tokens and log-probs
    (1e-5) as the whole re-prefill, on a tiny Qwen3.5 taught to call the tool, sampled (a group's rows finish at
    different steps: a finished row's states are taken as its last token is fed, before they step on; without that
    the log-probs differ by ~8e-4), with far fewer prefill tokens (measured: 26,192 -> 4,910)."""
    from tool_model import teach_tool_call

    lm = load_model(tiny_model_dir("qwen3_5"))
    losses = teach_tool_call(lm.model, lm.processor, samples[:1], steps=60, lr=3e-3)
    assert losses[-1] < 0.1, losses[-10:]
    params = SamplingParams(completions_per_prompt=3, temperature=1.0, max_new_tokens=100, seed=3)
    _, whole_stats, kept_stats = _kept_against_whole(lm.model, lm.processor, samples[:4], params)
    assert kept_stats["rollout/prefill_tokens"] < whole_stats["rollout/prefill_tokens"] / 3


def test_the_turn_budget_holds_three_turns_with_two_error_responses(load, samples, tiny_model_dir):
    """rollout.max_total_length resolved with the policy's tokenizer: the budget used to count 24 tokens of markup per
    tool response (the tiny tokenizer spells the tags out: more) and no bound on an error's text (a bad box's error
    ran to ~150 tokens), so a trajectory of whole turns ended at max_total_length before max_turns. Now the markup is
    measured, an error's text is cut at MAX_TOOL_TEXT_TOKENS, and three turns of max_new_tokens with two bad calls
    end at max_turns."""
    from vlgrpo.config import load_config
    from vlgrpo.data.prompts import MAX_TOOL_TEXT_TOKENS, tool_response_markup
    from vlgrpo.policy.prompt import PromptSettings

    model, processor = load("qwen2_5_vl")
    tok = processor.tokenizer
    bad = '<think>look</think><tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [5, 5]}}</tool_call>'
    turn = len(tok(bad, add_special_tokens=False)["input_ids"])
    schemas = tool_schemas(("zoom_in",))
    prompt = len(build_prompt(samples[0], processor, box_format="plain", tools=schemas).input_ids)
    cfg = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_dir()}",
            "rollout.tools=[zoom_in]",
            "rollout.max_turns=3",
            f"rollout.max_new_tokens={turn}",
            f"data.max_prompt_length={prompt}",
        ],
    )
    settings = PromptSettings.from_config(cfg, "plain", processor)
    assert tool_response_markup(tok) > 24  # what the old budget assumed
    engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain")
    engine.decode = Scripted(tok, [bad] * 3)
    tools = ToolRollout(engine, ("zoom_in",), 3, settings.max_total_length)
    (group,) = tools.generate(samples[:1], SamplingParams(completions_per_prompt=1, max_new_tokens=turn))
    c = group.completions[0]
    responses = [m for m in c.turns if m["role"] != "assistant"]
    assert len(responses) == 2 and c.finish_reason == "max_turns"  # both bad calls answered, all three turns taken
    error = responses[0]["content"][-2]["text"]
    assert error.startswith('"bbox_2d" must be') or "bbox_2d" in error
    assert len(tok(error, add_special_tokens=False)["input_ids"]) <= MAX_TOOL_TEXT_TOKENS
    assert len(c.token_ids) + prompt <= settings.max_total_length


def test_a_call_cut_by_max_new_tokens_is_scored_as_a_cut_completion_not_masked(load, samples):
    """The decision for a last turn cut by max_new_tokens inside a call: finish "length" like any cut completion,
    counted in tools/cut_calls, and not masked like an over-turn trajectory (masking it would let a policy escape a
    wrong answer's advantage by opening a call near the limit); its unclosed call gives no answer."""
    from vlgrpo.rewards.extract import extract_answer

    model, processor = load("qwen2_5_vl")
    tok = processor.tokenizer
    cut = '<think>look</think><tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [3'
    ids = tok(cut, add_special_tokens=False)["input_ids"]

    def decode(model, last, cache, next_pos, mask, run):
        return [Row(list(ids), [-0.5] * len(ids), "length") for _ in range(last.shape[0])]

    engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain", decode=decode)
    tools = ToolRollout(engine, ("zoom_in",), 3)
    (group,) = tools.generate(samples[:1], SamplingParams(completions_per_prompt=1, max_new_tokens=len(ids)))
    c = group.completions[0]
    assert c.finish_reason == "length" and c.tool_mask is None and tools.stats()["tools/cut_calls"] == 1.0
    assert not over_turn_mask([group]).any()
    assert extract_answer(c.text) == extract_answer("<think>look</think>")  # read without the call: never its "3"


ZOOM = '<tool_call>{{"name": "image_zoom_in_tool", "arguments": {{"bbox_2d": [{}, {}, {}, {}]}}}}</tool_call>'
REPLAY_SCRIPT = [
    [
        ZOOM.format(0, 0, 56, 56),
        "</think>" + ZOOM.format(10, 20, 70, 90),
        '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [5, 5]}}</tool_call>',  # an error turn
        "<answer>red</answer>",
    ],
    [ZOOM.format(30, 30, 90, 90), "</think><answer>blue</answer>"],
    ["<answer>2</answer>"],
]
"""What each turn's rows write after the tokens they sampled (turn k: REPLAY_SCRIPT[k], cycled over the rows)."""


class SampledThenScripted:
    """An HF engine `decode`: every row samples `sampled` tokens with the engine's own decode loop (the model's own
    tokens, which need not be the tokenizer's encoding of their text), then writes its scripted text for this turn,
    so that turns call the tool; a row that sampled EOS or a stop string ends there."""

    def __init__(self, tokenizer, script: list[list[str]], sampled: int):
        self.tokenizer, self.script, self.sampled, self.calls = tokenizer, script, sampled, 0

    def __call__(self, model, last, cache, next_pos, mask, run):
        short = replace(run, params=replace(run.params, max_new_tokens=self.sampled))
        rows = decode_loop(model, last, cache, next_pos, mask, short)
        texts = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        for r, row in enumerate(rows):
            if row.finish_reason == "length":
                ids = self.tokenizer(texts[r % len(texts)], add_special_tokens=False)["input_ids"]
                row.token_ids += ids
                row.logprobs += [-0.5] * len(ids)
                row.finish_reason = "stop"
        return rows


@pytest.mark.parametrize(
    "arch, thinking", [("qwen2_5_vl", "auto"), ("qwen3_vl", "auto"), ("qwen3_5", "on"), ("qwen3_5", "off")]
)
def test_saved_messages_replay_with_the_chat_template_to_the_ids_the_engine_fed(load, samples, arch, thinking):
    """Issue 59: every turn of a saved trajectory (`trajectory_messages`), replayed with the processor's own
    `apply_chat_template(messages[:k], tools=...)` and the processor over the saved images, gives the ids the engine fed
    that turn: the system turn with the tools block, the question with its instruction, the crops as the tool-response
    turn the model read, each assistant turn as sampled (Qwen3.5: after the opening of its turn, with thinking off the
    closed empty block). Before, no turn did (the saved conversation had none of these). The turns sample a few tokens
    of a spread tiny model, then a scripted call or answer: a sampled run that is not the tokenizer's encoding of its
    text cannot come back from text, so after one the ids are not compared, the text is."""
    model, processor = load(arch, spread_by=0.1)
    engine = HFEngine(
        model,
        processor,
        VisionCache(model, processor),
        box_format="plain",
        thinking=thinking,
        decode=SampledThenScripted(processor.tokenizer, REPLAY_SCRIPT, sampled=2),
    )
    engine.batch_prompts = 64  # each turn in one decode call
    tools = ToolRollout(engine, ("zoom_in",), max_turns=3)
    params = SamplingParams(completions_per_prompt=4, temperature=1.0, max_new_tokens=64, seed=1)
    groups = tools.generate(samples[:4], params)
    c = next(c for c in groups[0].completions if c.turns)
    system = trajectory_messages(groups[0].sample, c, crop_names(groups[0].sample, c, "crops"))[0]
    assert system["role"] == "system" and "<tools>" in system["content"]  # the tiny templates ignore tools=
    done = replay_groups(processor, groups, tools.schemas, thinking)
    print(arch, thinking, done)  # seen: 30 turns, 19-23 id-compared, 6-9 of them after a crop, 7-11 after turn 1
    assert done.turns >= 30 and done.ids >= 15 and done.after_crop >= 4 and done.later >= 5


RELEASED = {
    "qwen2_5_vl": ("qwen2_5_vl_chat_template", "user"),
    "qwen3_vl": ("qwen3_vl_chat_template", "tool"),
    "qwen3_5": ("qwen3_5_think_chat_template", "tool"),
}
"""Each family's released chat template (TRL keeps byte-exact copies) and how it takes a tool's result back."""


@pytest.mark.parametrize("arch", RELEASED)
def test_the_released_templates_get_the_tool_turn_and_the_tools_block_they_render(load, samples, arch):
    """With Qwen's released templates: Qwen2.5-VL's renders a `tool` message as `<|im_start|>tool` and ignores
    `tools=`, so the crop is saved as a user <tool_response> turn and the tools block in the system turn (after
    data.system_prompt); Qwen3-VL's and Qwen3.5's render a `tool` message as the user <tool_response> turn and the
    tools themselves, so the crop is a `tool` message and the system turn is data.system_prompt. Each replays to the
    engine's ids. Qwen3.5's template rewrites an assistant turn's think block as `<think>\\n{r}\\n</think>\\n\\n`:
    a turn written so replays, one written otherwise comes back in that form."""
    templates = pytest.importorskip("trl.chat_template_utils", reason="TRL keeps the released chat templates")
    name, role = RELEASED[arch]
    model, processor = load(arch)
    processor.chat_template = processor.tokenizer.chat_template = getattr(templates, name)
    assert tool_response_role(processor) == role
    think = "look\n</think>\n\n" if arch == "qwen3_5" else "<think>look</think>"  # Qwen3.5's prompt opens <think>
    turns = [think + ZOOM.format(0, 0, 56, 56), think.replace("look", "red") + "<answer>red</answer>"]
    engine = HFEngine(
        model, processor, VisionCache(model, processor), box_format="plain", system_prompt="Answer briefly."
    )
    engine.decode = Scripted(processor.tokenizer, turns)
    tools = ToolRollout(engine, ("zoom_in",), max_turns=3)
    (group,) = tools.generate(samples[:1], SamplingParams(completions_per_prompt=1, max_new_tokens=64))
    c = group.completions[0]
    messages = trajectory_messages(group.sample, c, ["crop.png"])
    system, user, first, response, second = messages
    assert second["content"][0]["text"].endswith("<answer>red</answer>")
    question = f"{group.sample.question} {instruction(group.sample.answer_type, 'think_answer', 'plain')}"
    assert user == {
        "role": "user",
        "content": [{"type": "image", "image": group.sample.image}, {"type": "text", "text": question}],
    }
    opening = "<think>\n" if arch == "qwen3_5" else ""  # what the generation prompt wrote of the turn
    assert first == {"role": "assistant", "content": [{"type": "text", "text": opening + turns[0]}]}
    if role == "user":
        assert (
            system["content"].startswith("Answer briefly.\n\n# Tools\n") and "image_zoom_in_tool" in system["content"]
        )
        assert response == {"role": "user", "content": [OPEN, {"type": "image", "image": "crop.png"}, CLOSE]}
    else:
        assert system == {"role": "system", "content": "Answer briefly."}
        assert response == {"role": "tool", "content": [{"type": "image", "image": "crop.png"}]}
        assert "image_zoom_in_tool" in processor.apply_chat_template(messages[:2], tools=tools.schemas, tokenize=False)
    images = {"crop.png": Image.open(io.BytesIO(c.images[0])), group.sample.image: Image.open(group.sample.image)}
    done = replay(processor, group.prompt_ids, c, messages, images, tools.schemas)
    assert done == Replayed(turns=2, ids=2, after_crop=1, later=1)
    if arch == "qwen3_5":  # the think block written otherwise: the template's form comes back, not the sampled text
        loose = [{**first, "content": [{"type": "text", "text": "<think>\nlook</think>" + ZOOM.format(0, 0, 56, 56)}]}]
        text = processor.apply_chat_template([system, user, *loose, response], tokenize=False)
        assert "<think>\nlook\n</think>\n\n<tool_call>" in text
