"""Training on multi-turn trajectories (rollout.tools, rollout.max_turns): the trainer's log-probs of a 3-turn
trajectory with two crops equal the transformers model's own forward over the whole sequence on pixels; a
tool-response token's logits get no gradient; the tools' crops come from the vision cache; GRPO steps with the zoom
tool called (the model's turns scripted) train, count the tools and pay the `tool` reward; and the config refuses
what multi-turn rollouts do not run with yet."""

from __future__ import annotations

import io
import json

import pytest
import torch
from PIL import Image
from pixel_reference import pixel_logits
from tool_model import CALL, scripted
from trainer_helpers import tiny_config

from vlgrpo.config import ConfigError, load_config
from vlgrpo.data.images import load_image
from vlgrpo.evals.run import make_evaluator
from vlgrpo.grpo.logprobs import token_logprobs
from vlgrpo.policy.forward import completion_logits, completion_logprobs_and_entropy
from vlgrpo.policy.prompt import forbidden_mask
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.hf import HFEngine
from vlgrpo.rollout.turns import ToolRollout
from vlgrpo.trainer.batch import attach_crops, make_batch, over_turn_mask
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state
from vlgrpo.types import Completion, RolloutGroup, Sample
from vlgrpo.vision_cache import VisionCache


def test_trajectory_logprobs_equal_the_pixel_forward_and_tool_tokens_get_no_gradient(load, samples):
    model, processor = load("qwen2_5_vl", spread_by=0.1)
    tok = processor.tokenizer
    calls = [CALL.format(0, 0, 56, 56), CALL.format(28, 28, 84, 70)]
    decode = scripted(tok, [[calls[0]], [calls[1]], ["<answer>2</answer>"]])
    cache = VisionCache(model, processor)
    engine = HFEngine(model, processor, cache, box_format="plain", decode=decode)
    (group,) = ToolRollout(engine, ("zoom_in",), 3).generate(samples[:1], SamplingParams(max_new_tokens=64))
    c = group.completions[0]
    assert len(c.images) == 2 and len(c.turns) == 5  # call, crop, call, crop, answer
    forbidden = forbidden_mask(tok, model.config.get_text_config().vocab_size)
    feats = cache.get_rows([engine.build_prompts(samples[:1])[0].sources])
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    batch = make_batch([group], feats, tok.pad_token_id, image_id, torch.nonzero(forbidden).flatten().tolist())
    attach_crops(batch, [group], cache)
    assert batch.masked_rows == 0  # the crops' placeholders are the tool's, not sampled
    tool = torch.tensor(c.tool_mask, dtype=torch.bool)
    assert torch.equal(batch.loss_mask[0].bool(), ~tool)
    model.train()
    logits = completion_logits(model, batch.batch, feats)  # [1, C, V]
    logits.retain_grad()
    ids = batch.batch.completion_ids.masked_fill(batch.batch.tool_mask > 0, 0)  # as completion_logprobs reads them
    logp, _ = token_logprobs(logits, ids, forbidden=forbidden)
    same, _ = completion_logprobs_and_entropy(model, batch.batch, feats, forbidden)
    assert torch.equal(same, logp) and bool(torch.isfinite(logp).all())
    # the reference: the model's own forward on pixels over prompt + trajectory (the original and both crops)
    images = [load_image(samples[0].image), *[load_image(x) for x in c.images]]
    ref = pixel_logits(model, processor, group.prompt_ids + c.token_ids, images)[len(group.prompt_ids) - 1 : -1]
    ref_logp, _ = token_logprobs(ref[None], batch.batch.completion_ids, forbidden=forbidden)
    sampled = ~tool
    assert float((logp[0, sampled] - ref_logp[0, sampled]).abs().max()) <= 1e-5
    # a policy-gradient loss over the masked tokens: no gradient reaches a tool-response token's logits
    loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
    assert bool(torch.isfinite(loss))
    loss.backward()
    grad = logits.grad[0].abs().sum(-1)  # [C]
    assert float(grad[tool].max()) == 0.0 and bool((grad[sampled] > 0).all())
    model.eval()


def test_over_turn_mask():
    s = Sample("s", "q", image="x.png")
    done, cut = Completion([1], "", "stop"), Completion([1], "", "max_turns")
    assert over_turn_mask([RolloutGroup(s, [0], [done, cut]), RolloutGroup(s, [0], [cut])]).tolist() == [
        False,
        True,
        True,
    ]


def _reward_file(tmp_path) -> str:
    (tmp_path / "red.py").write_text("def red(completion):\n    return float('red' in completion)\n")
    return f"{tmp_path / 'red.py'}:red"


def test_grpo_steps_with_the_zoom_tool_called(tmp_path, tiny_model_dir, shapes_dir):
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{_reward_file(tmp_path)}': 1.0, tool: 0.5, accuracy: 0.0}}",
        "rollout.tools=[zoom_in]",
        "rollout.max_turns=3",
        "rollout.max_new_tokens=48",
        "train.steps=3",
        "logging.trajectories_every=2",
        f"data.val={shapes_dir / 'val.jsonl'}",
        "eval.every_steps=2",
        "eval.suites=[vqa]",
        "eval.max_samples=2",
    )
    state = build_state(cfg, progress=False)
    state.evaluator = make_evaluator(cfg)  # evaluated with the tools too (its own engine decodes: no call)
    try:
        tok = state.lm.processor.tokenizer
        turns = [[CALL.format(0, 0, 40, 40)], ["<answer>red</answer>", "<answer>blue</answer>"]]
        state.engine.engine.decode = scripted(tok, turns)  # every step: turn 1 calls, turn 2 answers
        state.engine.engine.batch_prompts = 64  # each turn in one decode call
        history = Trainer(state).train()
    finally:
        state.close()
    for h in history:
        assert h["tools/calls_per_sample"] == 1.0 and h["tools/turns"] == 2.0 and h["tools/errors"] == 0.0
        assert h["reward/tool"] == h["reward/accuracy"]  # every trajectory got its crop: tool = accuracy
        assert 0 < h["reward/total"] < 1 and h["train/grad_norm"] > 0 and h["train/loss"] == h["train/loss"]
        assert h["vision/hits"] > 0  # the crops, encoded in the rollout, are cache hits in the update
    assert sum(h["reward/tool"] for h in history) > 0  # a "red" gold answered "red" after the crop
    assert history[1]["eval/tools/turns"] == 1.0 and "eval/vqa/accuracy" in history[1]  # eval.every_steps=2
    # step 2's sample trajectories, readable: the conversation and its crop
    (first, *_) = [json.loads(line) for line in (tmp_path / "run" / "trajectories" / "step_2.jsonl").open()]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    crop = first["messages"][3]["content"][1]["image"]  # Qwen2.5-VL's template: a user <tool_response> turn
    assert crop.startswith("step_2/") and Image.open(tmp_path / "run" / "trajectories" / crop).size == (40, 40)
    assert not (tmp_path / "run" / "trajectories" / "step_1.jsonl").exists()


def test_two_iterations_over_trajectories_with_crops_train_and_overlong_counts_the_models_tokens(
    tmp_path, tiny_model_dir, shapes_dir
):
    """grpo.num_iterations=2: the old log-probs score the tool-response tokens as the update pass does (a crop's
    placeholders at -inf made the ratio inf there and the masked loss NaN: every step with a crop was skipped as
    non-finite). reward.overlong: a trajectory is measured by the tokens the model sampled, so a calling trajectory
    is penalised as a non-calling one of the same sampled length (the tool response used to count)."""
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{_reward_file(tmp_path)}': 1.0, tool: 0.5}}",
        "rollout.tools=[zoom_in]",
        "rollout.max_turns=3",
        "rollout.max_new_tokens=48",
        "grpo.num_iterations=2",
        "reward.overlong.enabled=true",
        "reward.overlong.max_length=24",
        "reward.overlong.cache_length=16",
        "train.steps=2",
    )
    state = build_state(cfg, progress=False)
    try:
        tok = state.lm.processor.tokenizer
        turns = [[CALL.format(0, 0, 40, 40)], ["<answer>red</answer>", "<answer>blue</answer>"]]
        state.engine.engine.decode = scripted(tok, turns)
        state.engine.engine.batch_prompts = 64
        trainer = Trainer(state)
        history = trainer.train()
        # the same sampled tokens, with and without a tool response between them
        ids = tok("<answer>red</answer>", add_special_tokens=False)["input_ids"]
        plain = Completion(ids * 2, "<answer>red</answer>", "stop")
        mask = [0] * len(ids) + [1] * 40 + [0] * len(ids)
        called = Completion(ids + [0] * 40 + ids, "<answer>red</answer>", "stop", tool_mask=mask)
        rewards, metrics = trainer._rewards([RolloutGroup(_first_sample(shapes_dir), [1], [plain, called])])
    finally:
        state.close()
    for h in history:
        assert h["tools/calls_per_sample"] == 1.0 and h["train/loss"] == h["train/loss"]
        assert 0 < h["train/grad_norm"] < float("inf")
    assert plain.sampled_tokens == called.sampled_tokens == 2 * len(ids) and 8 < 2 * len(ids) < 24  # on the ramp
    assert rewards[0] == rewards[1] and -1 < metrics["reward/overlong"] < 0  # penalised alike, not as 2 x ids + 40


def _first_sample(shapes_dir):
    from vlgrpo.data.adapters import load_samples

    return load_samples(shapes_dir / "train.jsonl").samples[0]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.tools=[zoom_in]"], "tools need turns to answer in"),
        (["rollout.max_turns=3"], "tools need turns to answer in"),
        (["rollout.tools=[zoom]", "rollout.max_turns=3"], "accepted: zoom_in, or a user function as module:function"),
        (["rollout.tools=[zoom_in]", "rollout.max_turns=3", "model.freeze_vision=false"], "model.freeze_vision"),
        (["rollout.tools=[zoom_in]", "rollout.max_turns=3", "model.freeze_merger=false"], "model.freeze_merger"),
    ],
)
def test_config_refuses(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(None, overrides)


@pytest.fixture(scope="module")
def zoom_dir(tmp_path_factory):
    from vlgrpo.data.synth import synth_dataset

    out = tmp_path_factory.mktemp("zoom")
    synth_dataset(out, 20, seed=0, image_size=112, kinds=("zoom",))
    return out


def test_sft_with_the_zoom_tool_trains_on_gold_trajectories(tmp_path, tiny_model_dir, zoom_dir):
    """train.stage=sft with rollout.tools=[zoom_in]: a sample with a box becomes a gold trajectory: a call on its box
    (the zoom kind's named cell, a quarter of the image's side: no growth) in the model's box convention (Qwen2.5-VL's
    pixels of the 224 px resized input), the tool's own crop of the original image as the tool-response turn
    (tool_mask 1: out of the loss), the answer."""
    from vlgrpo.trainer.sft import gold_group

    cfg = tiny_config(
        tiny_model_dir(),
        zoom_dir,
        tmp_path / "run",
        "train.stage=sft",
        "rollout.tools=[zoom_in]",
        "rollout.max_turns=2",
        "data.max_prompt_length=1500",
    )
    state = build_state(cfg, progress=False)
    try:
        sample = state.rows.draw(1)[0]
        want = [v // 4 for v in sample.boxes[0]]  # /4: the original 896 px is resized to 224 px
        c = gold_group(state, sample).completions[0]
        call = json.loads(c.text.split("<tool_call>")[1].split("</tool_call>")[0])
        assert call == {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": want}}
        assert c.text.endswith(f"<answer>{sample.answer}</answer>")
        crop = Image.open(io.BytesIO(c.images[0]))
        box = tuple(4 * v for v in want)  # the zoom tool maps the resized pixels back to the original's
        assert crop.size == (224, 224)
        assert crop.tobytes() == load_image(sample.image).convert("RGB").crop(box).tobytes()
        tok = state.tokenizer
        tool = [i for i, m in zip(c.token_ids, c.tool_mask) if m]
        assert tok.decode(tool).count("<|image_pad|>") == 64 and "<tool_response>" in tok.decode(tool)
        assert tok.decode([i for i, m in zip(c.token_ids, c.tool_mask) if not m]).endswith("<|im_end|>")
        history = Trainer(state).train()
    finally:
        state.close()
    assert all(h["train/loss"] > 0 and h["train/grad_norm"] > 0 for h in history)
    assert history[-1]["vision/misses"] + history[-1]["vision/hits"] == 4  # 2 images and their 2 crops a step
