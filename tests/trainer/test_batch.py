"""The trainer's log-prob passes over a Qwen3-VL batch (cached features with their DeepStack maps, one prefill per
prompt, the packed completion pass or whole rows under gradient checkpointing) against the model's own forward."""

import pytest
import torch
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.data.images import load_image
from vlgrpo.data.prompts import render_messages
from vlgrpo.grpo.logprobs import token_logprobs
from vlgrpo.policy.forward import completion_logprobs_and_entropy
from vlgrpo.tiny import TinySpec, init_tiny
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state
from vlgrpo.types import Completion, RolloutGroup


def _own_forward_logprobs(model, processor, groups, forbidden, prompt_kw):
    """Each completion's token log-probs from the transformers model called with pixel_values on prompt + completion."""
    out = []
    for g in groups:
        messages = render_messages(
            g.sample, **{k: v for k, v in prompt_kw.items() if k not in ("video_sampling", "thinking")}
        )
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        for c in g.completions:
            inputs = processor(text=[text], images=[load_image(g.sample.image)], return_tensors="pt")
            assert inputs["input_ids"][0].tolist() == g.prompt_ids
            comp = torch.tensor([c.token_ids])
            inputs["input_ids"] = torch.cat([inputs["input_ids"], comp], 1)
            inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(comp)], 1)
            inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(comp)], 1)
            with torch.no_grad():
                logits = model(**inputs).logits[:, -comp.shape[1] - 1 : -1]
            out.append(token_logprobs(logits, comp, forbidden=forbidden)[0][0])
    return out


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_trainer_logprobs_over_a_qwen3_vl_batch_equal_the_models_own_forward(tmp_path, shapes_dir, spread, tied):
    model_dir = init_tiny(tmp_path / "m", "qwen3_vl", spec=TinySpec(tie_word_embeddings=tied))
    cfg = tiny_config(str(model_dir), shapes_dir, tmp_path / "run", "model.gradient_checkpointing=true")
    state = build_state(cfg, progress=False)
    try:
        trainer, model, processor = Trainer(state), state.backend.model, state.lm.processor
        spread(model, 0.1)
        samples = _samples(shapes_dir)
        tok = processor.tokenizer
        texts = [["<answer>3</answer>", "<answer>no", "two"], ["<answer>red square</answer>", "yes"], ["[12, 40"]]
        groups = [
            RolloutGroup(s, p.input_ids, [Completion(tok(t)["input_ids"] + [tok.eos_token_id], t, "stop") for t in ts])
            for s, p, ts in zip(samples, state.engine.build_prompts(samples), texts)
        ]
        assert len({len(g.prompt_ids) for g in groups}) > 1  # left-padded prompts, right-padded completions
        batch = trainer._collate(groups, state.cache.get_rows([[g.sample.image] for g in groups]))
        assert batch.features[0][0].deepstack.shape[0] == 2  # the maps reach the trainer's batch
        own = _own_forward_logprobs(model, processor, groups, state.forbidden, state.engine.prompt_kw)
        old = trainer._logprobs(model, batch)  # the old / reference pass: eval mode, packed completion pass
        model.train()  # the update pass: train mode, gradient checkpointing on -> whole rows through policy_logits
        assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
        for rows, part, feats in trainer.micro_batches(batch):
            new, _ = completion_logprobs_and_entropy(model, part, feats, state.forbidden)
            new.sum().backward()
            for r, lp in zip(range(rows.start, rows.stop), new):
                n = len(own[r])
                assert (lp[:n] - own[r]).abs().max() <= 1e-5
        for r, ref in enumerate(own):
            assert (old[r, : len(ref)] - ref).abs().max() <= 1e-5
        assert model.model.language_model.layers[0].self_attn.q_norm.weight.grad is not None
    finally:
        model.zero_grad(set_to_none=True)
        state.close()


def _samples(shapes_dir):
    from vlgrpo.data.adapters import load_samples

    return load_samples(shapes_dir / "train.jsonl").samples[:3]


def test_a_qwen3_vl_step_with_a_trainable_tower_moves_its_deepstack_mergers(tmp_path, shapes_dir, tiny_model_dir):
    """The update pass re-encodes with autograd, DeepStack maps included: their mergers get gradients and move."""
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir("qwen3_vl"),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "model.freeze_vision=false",
        "model.freeze_merger=false",
        "grpo.beta=0.04",
        "train.steps=1",
    )
    state = build_state(cfg, progress=False)
    before = {n: p.detach().clone() for n, p in state.backend.model.named_parameters()}
    (row,) = Trainer(state).train()
    after = dict(state.backend.model.named_parameters())
    state.close()
    moved = [n for n in before if not torch.equal(before[n], after[n])]
    assert any(".deepstack_merger_list.0." in n for n in moved) and any(".deepstack_merger_list.1." in n for n in moved)
    assert row["vision/images_encoded"] >= 4  # phase 2 and the update pass's re-encode
