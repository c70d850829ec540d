"""Gradient checkpointing engages in the trainer's update and SFT passes (train mode, dropout at 0): every decoder
layer runs a second time under backward, and loss and gradients equal the run without checkpointing. The dropout-free
train mode gives exactly the eval-mode log-probs (the on-policy ratio is 1) and restores every probability."""

from __future__ import annotations

import re

import pytest
import torch
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.data.adapters import load_samples
from vlgrpo.policy.forward import completion_logprobs
from vlgrpo.trainer.backends import no_dropout
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state

STAGES = {  # 2 micro-batches per step in both: GRPO 2 prompts x 4 completions by 4, SFT 4 gold answers by 2
    "grpo": ["train.micro_batch_completions=4"],
    "sft": ["train.stage=sft", "train.prompts_per_step=4", "train.micro_batch_completions=2"],
}


def _one_step(tmp_path, model_dir, shapes_dir, stage: str, checkpointing: bool) -> dict:
    """One trainer step; counts the decoder layers' train-mode forwards outside and inside backward and keeps the
    gradients the optimiser stepped with (the backend's own backward/step, observed, not replaced)."""
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        model_dir,
        shapes_dir,
        tmp_path / f"run_{stage}_{checkpointing}",
        "train.steps=1",
        f"reward.recipe={{'{spec}': 1.0}}",
        f"model.gradient_checkpointing={checkpointing}",
        *STAGES[stage],
    )
    state = build_state(cfg, progress=False)
    backend, model = state.backend, state.backend.model
    counts, phase, grads = {"forward": 0, "backward": 0}, ["forward"], {}

    def count(module, args):
        if module.training:  # the rollout and the no-grad log-prob passes run in eval mode
            counts[phase[0]] += 1

    layers = [m for n, m in model.named_modules() if re.fullmatch(r".*language_model\.layers\.\d+", n)]
    for layer in layers:
        layer.register_forward_pre_hook(count)
    # per train-mode pass: the positions per row the decoder runs and those the LM head turns into logits (the
    # shared-prefix pass calls the head twice: the prompts' last positions, then the packed completions)
    row_positions: list[int] = []
    head_positions: list[int] = []
    layers[0].register_forward_pre_hook(
        lambda m, args, kw: (
            row_positions.append(kw["hidden_states"].shape[-2] if args == () else args[0].shape[-2])
            if m.training and phase[0] == "forward"
            else None
        ),
        with_kwargs=True,
    )
    model.lm_head.register_forward_pre_hook(
        lambda m, args: head_positions.append(args[0].shape[-2]) if model.training else None
    )
    backward, step = backend.backward, backend.step

    def observed_backward(loss):
        phase[0] = "backward"
        try:
            backward(loss)
        finally:
            phase[0] = "forward"

    def observed_step():
        grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return step()

    backend.backward, backend.step = observed_backward, observed_step
    (row,) = Trainer(state).train()
    state.close()
    return {
        "layers": len(layers),
        "counts": counts,
        "loss": row["train/loss"],
        "grads": grads,
        "positions": (row_positions, head_positions),
    }


@pytest.mark.parametrize("stage", ["grpo", "sft"])
def test_checkpointing_recomputes_each_layer_under_backward_with_equal_gradients(
    tmp_path, tiny_model_dir, shapes_dir, stage
):
    plain = _one_step(tmp_path, tiny_model_dir(), shapes_dir, stage, checkpointing=False)
    ckpt = _one_step(tmp_path, tiny_model_dir(), shapes_dir, stage, checkpointing=True)
    n, micro = ckpt["layers"], 2
    assert n == 4 and plain["counts"]["backward"] == 0
    # checkpointed: whole rows forwarded once per micro-batch, then each layer recomputed under backward
    assert ckpt["counts"] == {"forward": n * micro, "backward": n * micro}
    # ... but only the completion's positions and the prompt's last reach the LM head (logits_to_keep): the prompt's
    # others, its 16 image tokens of a 112 px image among them, never become vocabulary-sized logits
    rows, head = ckpt["positions"]
    assert len(rows) == len(head) == micro and all(r - h >= 16 for r, h in zip(rows, head, strict=True))
    assert ckpt["loss"] == pytest.approx(plain["loss"], rel=1e-6, abs=1e-8)
    assert plain["grads"].keys() == ckpt["grads"].keys() and len(plain["grads"]) > 10
    for name, g in plain["grads"].items():
        torch.testing.assert_close(ckpt["grads"][name], g, rtol=0, atol=1e-6, msg=name)


def test_no_dropout_gives_the_eval_log_probs_in_train_mode(tmp_path, tiny_model_dir, shapes_dir):
    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", "train.backend=lora", "train.lora.dropout=0.5")
    state = build_state(cfg, progress=False)
    model, trainer = state.backend.model, Trainer(state)
    attention = [m for m in model.modules() if isinstance(getattr(m, "attention_dropout", None), float)]
    for m in attention:
        m.attention_dropout = 0.3  # as a checkpoint's config could set it
    samples = load_samples(shapes_dir / "train.jsonl").samples[:2]
    batch = trainer._collate(
        state.engine.generate(samples, state.sampling_for(0)), state.cache.get([x.image for x in samples])
    )

    def logprobs():
        with torch.no_grad():
            return torch.cat(
                [
                    completion_logprobs(model, part, feats, state.forbidden, state.temperature)
                    for _, part, feats in trainer.micro_batches(batch)
                ]
            )

    eval_logp = trainer._logprobs(model, batch)
    model.eval()
    with no_dropout(model):
        assert model.training
        assert torch.equal(logprobs(), eval_logp)
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert attention and dropouts and not model.training
    assert all(m.p == 0.5 for m in dropouts) and all(m.attention_dropout == 0.3 for m in attention)  # restored
    model.train()  # plain train mode: the dropout is live, the log-probs move
    assert not torch.equal(logprobs(), eval_logp)
    state.close()
